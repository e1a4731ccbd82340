"""A worker's memory as the start budgets it (bert_serve_server/measure.py) against a worker
measured for real: deploy/image-test.json's, in the container under the pod's limits.

This test loads the shipped model in a child process (about 10 s on a quiet 2-core machine):
the memory a start budgets per worker decides how many fit, and an estimate under what a
worker really holds lets the pod's workers outgrow its limit."""

from __future__ import annotations

import json

from bert_serve_server import measure, served

from tests.conftest import MAR_PATH, ROOT

MIB = 2**20


def test_the_measured_worker_memory_covers_the_image_records_worker() -> None:
    record = json.loads((ROOT / "deploy" / "image-test.json").read_text())
    workers = [p["pss_mib"] for p in record["processes"] if p["role"] == "worker"]
    assert workers, "the record measured a worker"
    memory = measure.measured_memory(str(MAR_PATH), MAR_PATH.stat().st_mtime_ns)
    assert served.budgeted_bytes(memory) / MIB >= max(workers), (memory, workers)
    assert memory.peak_bytes >= memory.pss_bytes > 0 and memory.uss_bytes > 0
