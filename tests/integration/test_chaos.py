"""`python -m lab chaos --quick` end to end: real servers, faults and overload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.chaos import QUICK_ATTEMPT_S
from tests.conftest import MAR_PATH, ROOT

# alone (scripts/test.sh): kills, overload and a spike, checked under its own load only
pytestmark = pytest.mark.alone

PARTS = (
    "poisoning_soak",
    "worker_crash",
    "overload",
    "oversized",
    "restart",
    "kill_runs",
    "kill_runs_long_delay",
    "spike",
)


def test_chaos_quick_passes_every_part(tmp_path: Path) -> None:
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    result = subprocess.run(
        # --no-peer: the quick form checks our server; LitServe's spike is `make chaos`'s
        [sys.executable, "-m", "lab", "chaos", "--quick", "--no-peer", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "chaos.json").read_text())
    assert {part: report[part]["passed"] for part in PARTS} == dict.fromkeys(PARTS, True)
    assert result.stdout.strip().splitlines()[-1] == f"chaos: {len(PARTS)} passed, 0 failed"
    # 2 kills a level (a replaced worker killed again), 1 at the long delay (its wider window)
    for part, kills in (("kill_runs", 2), ("kill_runs_long_delay", 1)):
        levels = report[part]["levels"].values()
        assert [level["kills"] for level in levels] == [kills, kills]
        assert report[part]["client_failed"] == report[part]["client_hung"] == 0
        # a dropped request waits the quick form's deadline, not the client's default 70 s
        assert report[part]["client_settings"]["timeout_s"] == QUICK_ATTEMPT_S
