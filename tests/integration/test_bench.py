"""The benchmark tool keeps working: a few-second run writes its JSON and plots. The numbers are
not checked here (performance is measured by `make bench`, never by a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_bench_smoke_run_writes_results(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "scripts/bench.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["ceiling"]["texts_per_s"] > 0
    level = results["scenarios"]["torchserve_batched"]["by_concurrency"]["2"]
    assert level["requests"] > 0 and level["errors"] == 0
    assert level["batches"] > 0 and level["padding_efficiency"] is not None
    lists = results["scenarios"]["torchserve_batched"]["client_lists"]
    assert lists[0]["texts"] == 64 and lists[0]["errors"] == 0 and lists[0]["texts_per_s"] > 0
    assert {"served_vs_ceiling", "padding_efficiency", "errors_batched"} <= set(results["ratios"])
    assert "client_lists_vs_single_texts" in results["ratios"]
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert (tmp_path / "latency.png").stat().st_size > 0
