"""The benchmark tool keeps working: a few-second run writes its JSON and plots. The numbers are
not checked here (performance is measured by `make bench`, never by a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT


def run_tool(script: str, out: Path, *args: str, written: str = "results.json") -> dict[str, Any]:
    """Run ``scripts/<script>`` with ``--out out``; the JSON it wrote (``written``)."""
    result = subprocess.run(
        [sys.executable, f"scripts/{script}", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads((out / written).read_text()))


def test_bench_smoke_run_writes_results(tmp_path) -> None:
    results = run_tool("bench.py", tmp_path, "--smoke")
    assert results["ceiling"]["texts_per_s"] > 0
    level = results["scenarios"]["torchserve_batched"]["by_concurrency"]["2"]
    assert level["requests"] > 0 and level["errors"] == 0
    assert level["batches"] > 0 and level["padding_efficiency"] is not None
    lists = results["scenarios"]["torchserve_batched"]["client_lists"]
    assert lists[0]["texts"] == 64 and lists[0]["errors"] == 0 and lists[0]["texts_per_s"] > 0
    assert {"served_vs_ceiling", "padding_efficiency", "errors_batched"} <= set(results["ratios"])
    assert "client_lists_vs_single_texts" in results["ratios"]
    assert (tmp_path / "serving.png").stat().st_size > 0
    default = results["scenarios"]["torchserve_batched"]
    assert default["startup_s"] > 0 and default["worker_memory"][0]["uss_mb"] > 0


def test_tune_smoke_run_recommends_across_loads(tmp_path) -> None:
    candidates = ["b1d0w1t1", "b4d1w1t1"]
    loads = ["--loads", "1", "2", "--seconds", "1", "--warmup", "0.3", "--log-rounds", "0"]
    results = run_tool("tune.py", tmp_path, "--candidates", *candidates, *loads)
    assert [run["name"] for run in results["runs"]] == ["b1d0w1t1", "b4d1w1t1"]
    for run in results["runs"]:
        assert set(run["by_concurrency"]) == {"1", "2"}
    best = results["recommended"]
    assert best["name"] in {"b1d0w1t1", "b4d1w1t1"}
    assert 0 < best["worst_ratio"] <= 1 and set(best["ratios"]) == {"1", "2"}
    assert "models=" in (tmp_path / "recommended.properties").read_text()
    assert (tmp_path / "tune.png").stat().st_size > 0


@pytest.mark.alone  # its bar of no refused patient client holds on a machine to itself
def test_defaults_check_runs_on_a_stand_in_model() -> None:
    """`make check-defaults` on the fast stand-in with one-second levels: every level ran and
    was answered; the sizing it reports is what the server ran. Its bars need a quiet machine
    and full levels, so only the one that holds on any machine is asserted: 256 patient
    clients are never refused."""
    from lab import defaults_check

    (result,) = defaults_check.run(("fast",), seconds=1.0).values()
    levels = result["levels"]
    assert set(levels) == {"capacity", "patient", "stated", "unstated"}
    assert all(level["silently_lost"] == 0 for level in levels.values())
    assert levels["capacity"]["goodput_per_s"] > 0
    assert levels["patient"]["refusals"] == 0, levels["patient"]["statuses"]
    assert 64 <= levels["stated"]["clients"] <= 256
    assert set(levels["stated"]["statuses"]) <= {"200", "504", "client_timeout"}
    for level in levels.values():
        assert set(level["cores"]) == {"frontend", "workers", "load_generator"}
        assert level["cores"]["workers"] > 0 and level["cores"]["load_generator"] > 0
    assert set(result["bars"]) == {
        "patient_refusals",
        "stated_share_of_patient",
        "stated_vs_unstated_goodput",
        "forwarded_late",
    }
