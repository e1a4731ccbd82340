"""A worker's memory as the start budgets it (bert_serve_server/probe.py) against a worker
measured for real: deploy/image-test.json's, in the container under the pod's limits, and a
worker of the tiny test model given the largest batch the limits admit.

These tests load models in child processes (about 10 s each on a quiet 2-core machine): the
memory a start budgets per worker decides how many fit, and an estimate under what a worker
really holds lets the pod's workers outgrow its limit."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from bert_serve_server import probe, sizing

from tests.conftest import ROOT, start_memory

MIB = 2**20
LIMITS = {"max_chars": 60, "max_texts_per_request": 4096, "torch_threads": 1}
"""The tiny model's limits: texts short enough that a pair is never truncated (the handler's
tokenizer keeps the overflow of a truncated pair, which grows with the square of its length),
lists long enough that the largest batch holds a few hundred MiB."""
BATCH = 4
MAX_REQUEST = 2**20


def test_the_measured_worker_memory_covers_the_image_records_worker() -> None:
    record = json.loads((ROOT / "deploy" / "image-test.json").read_text())
    workers = [p["pss_mib"] for p in record["processes"] if p["role"] == "worker"]
    assert workers, "the record measured a worker"
    memory = start_memory()
    assert sizing.budgeted_bytes(memory) / MIB >= max(workers), (memory, workers)
    assert memory.peak_bytes >= memory.pss_bytes > 0 and memory.uss_bytes > 0


def tiny_archive(path: Path, model_dir: Path, limits: dict[str, Any]) -> Path:
    """A .mar of the tiny model, the checkout's handler and model-config.yaml with ``limits``."""
    config = yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())
    config["handler"] = {**config["handler"], **limits}
    manifest = {"model": {"modelName": "bert", "modelVersion": "1.0"}}
    manifest["model"]["configFile"] = "model-config.yaml"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("model-config.yaml", yaml.safe_dump(config))
        for source in sorted((ROOT / "handler").glob("*.py")):
            archive.write(source, f"handler/{source.name}")
        for source in sorted(model_dir.iterdir()):
            archive.write(source, f"model/{source.name}")
    return path


REAL_BATCH = """
import json, sys
from pathlib import Path
import torch
from bert_serve_server import probe
from tests.worker_harness import Sent, build_worker, predict
workdir, model_dir, limits, batch, max_request = sys.argv[1:]
limits = json.loads(limits)
torch.set_num_threads(1)
worker = build_worker(Path(workdir), Path(model_dir), limits, batch_size=int(batch))
bodies, shown = probe.largest_bodies(
    int(batch), int(max_request), limits["max_chars"], limits["max_texts_per_request"]
)
sent = [Sent(bytes(body), "application/json") for body in bodies]
del bodies
answers = predict(worker.service, sent)
results = [len(json.loads(answer.body)["results"]) for answer in answers]
print(json.dumps({
    "peak": probe.process_memory()[0],
    "statuses": sorted({answer.status for answer in answers}),
    "results": results,
    "largest": max(len(s.body or b"") for s in sent),
}))
"""


def test_the_budget_covers_a_worker_given_the_largest_batch(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The start measures a worker holding and tokenizing the largest batch the limits admit
    (BATCH requests of the largest body, lists of pairs); a real worker (TorchServe's worker
    code and the handler, in a process of its own) given that batch answers every text, and
    peaks within the budget. Before, the budget was the peak after a batch of 128-token texts
    only, and this worker peaked a few hundred MiB over it."""
    mar = tiny_archive(tmp_path / "tiny.mar", tiny_model_dir, LIMITS)
    measured = probe.WorkerMemory(**probe.in_fresh_process("memory", mar, [1, BATCH, MAX_REQUEST]))
    assert measured.batch.startswith(f"{BATCH} requests of ") and measured.batch_bytes > 0
    done = subprocess.run(
        [sys.executable, "-c", REAL_BATCH, str(tmp_path / "worker"), str(tiny_model_dir),
         json.dumps(LIMITS), str(BATCH), str(MAX_REQUEST)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    real = json.loads(done.stdout.splitlines()[-1])
    assert real["statuses"] == [200] and real["largest"] <= MAX_REQUEST
    assert real["results"] == [LIMITS["max_texts_per_request"]] * BATCH, "every text answered"
    assert sizing.budgeted_bytes(measured) >= real["peak"], (measured, real["peak"] // MIB)


def test_a_child_that_does_nothing_for_too_long_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measuring child that finishes no step (a hung CUDA initialization) is stopped after
    the timeout (BERT_SERVE_MEASURE_TIMEOUT_S here), with a message naming its last step."""
    monkeypatch.setenv(probe.TIMEOUT_ENV, "1.5")
    monkeypatch.setattr(probe, "MEASURE_SCRIPT", "import time; time.sleep(60)")
    mar = tmp_path / "hung.mar"
    mar.write_bytes(b"")
    with pytest.raises(RuntimeError, match=r"timed out: no step done for \d+ s after 'started'"):
        probe.in_fresh_process("device_load", mar, [8])


def test_a_child_that_outgrows_the_machine_is_stopped(tmp_path: Path) -> None:
    """A measuring child past the memory a worker may hold here is stopped, saying so."""
    mar = tmp_path / "large.mar"
    mar.write_bytes(b"")
    script = "import time; held = bytearray(64 * 2**20); held[::4096] = b'x' * len(held[::4096]); time.sleep(60)"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probe, "MEASURE_SCRIPT", script)
        with pytest.raises(RuntimeError, match="more than the 32 MiB this machine can give it"):
            probe.in_fresh_process("memory", mar, [1], cap_bytes=32 * MIB)


def test_the_timeout_follows_the_archive_and_can_be_stated(tmp_path: Path) -> None:
    mar = tmp_path / "bert.mar"
    mar.write_bytes(b"x" * 2**20)
    derived = probe.timeout_s(mar, {})
    assert derived == pytest.approx(probe.STEP_TIMEOUT_S + probe.STEP_S_PER_GIB / 1024)
    assert probe.timeout_s(mar, {probe.TIMEOUT_ENV: "900"}) == 900
    with pytest.raises(probe.MeasureError, match=probe.TIMEOUT_ENV):
        probe.timeout_s(mar, {probe.TIMEOUT_ENV: "soon"})


SLOW_HANDLER = {
    "handler/__init__.py": "",
    "handler/precision.py": "AUTO = 'auto'\n",
    "handler/settings.py": (
        "class HandlerSettings:\n"
        "    max_length, max_chars, max_texts_per_request = 8, 100, 4\n"
        "    @classmethod\n"
        "    def from_mapping(cls, raw):\n"
        "        return cls()\n"
    ),
    "handler/model.py": (
        "class Loaded:\n"
        "    max_batch_tokens, tokenizer = 0, None\n"
        "def load_model(folder, settings, device):\n"
        "    return Loaded()\n"
    ),
    "handler/inference.py": (
        "import time\n"
        "def classify(loaded, texts, max_length, max_batch_tokens):\n"
        "    pass\n"
        "def tokenize(tokenizer, texts, max_length):\n"
        "    time.sleep(0.6)\n"
        "    return []\n"
    ),
    "model/config.json": "{}",
}


def test_a_largest_batch_too_slow_to_tokenize_is_left_out_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler whose tokenizing of the largest batch would take past the timeout: the worker
    is measured without it and the measurement says why (the start then warns), rather than
    waiting it out or refusing the model."""
    mar = tmp_path / "slow.mar"
    with zipfile.ZipFile(mar, "w") as archive:
        for name, text in SLOW_HANDLER.items():
            archive.writestr(name, text)
    monkeypatch.setenv(probe.TIMEOUT_ENV, "20")
    memory = probe.memory_of(str(mar), mar.stat().st_mtime_ns, 1, 64, None, None)
    assert memory.batch.startswith(probe.NOT_MEASURED) and "would take about" in memory.batch
    assert memory.batch_bytes == 0 and memory.peak_bytes > 0
