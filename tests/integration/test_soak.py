"""scripts/soak.py end to end for 20 s: the tool runs, samples and writes its report and plot.

The memory bar itself needs the 10-minute run (make soak); 20 s only proves the tool works.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bert_serve_server import measure, served, sizing

from tests.conftest import MAR_PATH, ROOT


def test_soak_tool_samples_memory_rps_and_logs(tmp_path: Path) -> None:
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    result = subprocess.run(
        [sys.executable, "scripts/soak.py", "--seconds", "20", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(result.stdout)
    assert result.returncode in (0, 1), result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1] in ("soak: passed", "soak: FAILED")
    report = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert report["requests"] > 0 and report["unexpected"] == 0
    assert report["by_kind"]["list"] == {"200": report["by_kind"]["list"]["200"]}
    assert len(report["samples"]) >= 10
    workers = [name for name in report["rss"] if name.startswith("worker ")]
    # the start sizes the workers for this machine (config.properties states none)
    machine = sizing.read_machine(gpus=sizing.gpu_count())
    worker = measure.measured_memory(str(MAR_PATH), MAR_PATH.stat().st_mtime_ns)
    expected = sizing.workers_for(machine, served.budgeted_bytes(worker))
    assert "frontend" in report["rss"] and len(workers) == expected[0], (workers, expected)
    assert all(entry["baseline_mb"] > 0 for entry in report["rss"].values())
    assert report["log_folder"]["growth_bytes"] > 0
