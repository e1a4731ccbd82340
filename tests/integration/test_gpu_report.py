"""The GPU report's command keeps working without a GPU: its smoke form (the CPU, a tiny model)
writes every section of the report, the plot and the bars. The numbers are not checked here.

It runs with ``make gpu-report-smoke`` (BERT_SERVE_GPU_SMOKE=1), not in ``make test``: it starts
six servers and processes and took 806 s on a loaded 2-core machine, which would take CI past
its time limit (docs/testing.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SECTIONS = ("sweep_fp32", "sweep_bf16", "peer", "lone_request", "bs1", "tf32", "ceiling")


@pytest.mark.skipif(
    os.environ.get("BERT_SERVE_GPU_SMOKE") != "1",
    reason="minutes long: make gpu-report-smoke runs it (BERT_SERVE_GPU_SMOKE=1)",
)
def test_the_smoke_run_writes_every_section(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gpu_report.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(SECTIONS) <= set(report) and set(SECTIONS) <= set(report["phases"])
    assert not [name for name in SECTIONS if "error" in report[name]], report
    assert not [name for name in SECTIONS if "budget" in report[name].get("skipped", "")]
    rule = report["rule"]
    sweep = report["sweep_fp32"]
    assert sweep["rule_workers_per_gpu"] == rule["workers_per_gpu"] >= 1
    assert str(rule["workers_per_gpu"] + 1) in sweep["by_workers_per_gpu"]
    for run in [*sweep["by_workers_per_gpu"].values(), report["bs1"]["by_concurrency"]]:
        for clients, level in run.items():
            assert level["requests"] > 0 and level["errors"] == 0, (clients, level)
            assert level["host_cpu_busy_pct"] > 0 and level["cores"]["workers"] > 0
    assert report["sweep_bf16"].get("by_workers_per_gpu") or report["sweep_bf16"]["skipped"]
    assert "CUDA" in report["tf32"]["skipped"]
    peer = report["peer"]["by_concurrency"]
    assert all(level["errors"] == 0 and level["rps"] > 0 for level in peer.values())
    lone = report["lone_request"]
    assert lone["in_process"]["eager"]["p50_ms"] > 0
    assert "CUDA" in lone["served"]["cuda_graphs"]["skipped"]
    assert report["ceiling"]["texts_per_s"] > 0
    assert report["scores"]["texts"] == 64 and report["scores"]["max_scores_change"] < 1e-4
    assert "served_fp32_vs_cpu_scores" in report["bars"] and report["limits"]["fp32"]
    assert (tmp_path / "gpu.png").stat().st_size > 0
