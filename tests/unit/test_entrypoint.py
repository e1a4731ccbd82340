"""deploy/entrypoint.sh run with stand-ins for the image's python3.11 and torchserve: SIGTERM
is honoured at once during the sizing step, and turned into a drain and a bounded stop later."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import ROOT

ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
# python3.11 -m bert_serve_server size --out FILE -- ...: a slow sizing that then prints 1
FAKE_PYTHON = """#!/bin/sh
if [ "$3" = "stop" ]; then
    shift 3
    echo "stop $*" >> "$HOME/calls"
    kill -TERM "$(cat "$HOME/ts.pid")"
    exit 0
fi
if [ "$3" = "ready" ]; then
    shift 3
    echo "ready $*" >> "$HOME/calls"
    exit 0
fi
echo sizing >> "$HOME/calls"
echo "$BERT_SERVE_MEASURE_CACHE" > "$HOME/measure-cache"
sleep "$SIZING_S"
echo 1
echo bert:1.0=bf16
"""
# torchserve --foreground runs until the stop (python3.11 -m bert_serve_server stop) kills it
FAKE_TORCHSERVE = """#!/bin/sh
echo "serve OMP_NUM_THREADS=$OMP_NUM_THREADS RAYON_NUM_THREADS=$RAYON_NUM_THREADS \
BERT_SERVE_PRECISION_CHOSEN=$BERT_SERVE_PRECISION_CHOSEN TMPDIR=$TMPDIR" >> "$HOME/calls"
[ -n "$FRONTEND_DIES" ] && exit 0  # the launcher's status whatever ended the frontend
sleep 60 &
echo $! > "$HOME/ts.pid"
wait
"""


def start(tmp_path: Path, sizing_s: float, **env: str) -> subprocess.Popen[bytes]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3.11", FAKE_PYTHON), ("torchserve", FAKE_TORCHSERVE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SIZING_S": str(sizing_s),
        **env,
    }
    return subprocess.Popen(["sh", str(ENTRYPOINT), "--ts-config", "x"], env=env)


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().split("\n")[:-1] if path.is_file() else []


def wait_for(tmp_path: Path, call: str) -> None:
    deadline = time.monotonic() + 20
    while not any(line.startswith(call) for line in calls(tmp_path)):
        assert time.monotonic() < deadline, f"no {call!r} in {calls(tmp_path)}"
        time.sleep(0.05)


def test_sigterm_during_the_sizing_exits_at_once(tmp_path: Path) -> None:
    process = start(tmp_path, sizing_s=30)
    wait_for(tmp_path, "sizing")
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert time.monotonic() - sent < 5, "the sizing step was not waited out"
    assert calls(tmp_path) == ["sizing"], "TorchServe never started"


def test_sigterm_while_serving_drains_then_stops_torchserve(tmp_path: Path) -> None:
    process = start(tmp_path, sizing_s=0)
    wait_for(tmp_path, "serve")
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=20)
    assert calls(tmp_path) == [
        "sizing",
        "serve OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 BERT_SERVE_PRECISION_CHOSEN=bert:1.0=bf16 "
        f"TMPDIR={tmp_path}/tmp",
        "ready --drain",
        "stop --timeout 15",
    ]
    assert (tmp_path / "tmp").is_dir()


def test_the_drain_waits_for_the_proxys_port_when_told(tmp_path: Path) -> None:
    process = start(tmp_path, sizing_s=0, BERT_SERVE_DRAIN_WAIT_PORT="8000")
    wait_for(tmp_path, "serve")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert "ready --drain --wait-port 8000" in calls(tmp_path)


def test_a_frontend_that_ends_unasked_exits_non_zero(tmp_path: Path) -> None:
    """TorchServe's launcher exits 0 when the Java frontend dies or cannot bind its port: the
    container must not read as Completed."""
    process = start(tmp_path, sizing_s=0, FRONTEND_DIES="1")
    assert process.wait(timeout=20) == 1
    assert calls(tmp_path)[-1].startswith("serve"), "no drain or stop was run"


def test_the_stop_is_bounded_by_its_budget(tmp_path: Path) -> None:
    """The stop is the server package's, which kills the frontend and its workers past
    BERT_SERVE_STOP_S (tests/unit/test_server_stop.py), not `torchserve --stop`, which only
    signals and left a frontend that ignored it running."""
    process = start(tmp_path, sizing_s=0, BERT_SERVE_STOP_S="1")
    wait_for(tmp_path, "serve")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert calls(tmp_path)[-1] == "stop --timeout 1"


def test_the_sizing_keeps_its_measurements_in_the_home(tmp_path: Path) -> None:
    """The home is an emptyDir, which outlives a restarted container: its measurements too."""
    process = start(tmp_path, sizing_s=0)
    wait_for(tmp_path, "serve")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert (tmp_path / "measure-cache").read_text().strip() == f"{tmp_path}/measured"


def test_a_stated_measurement_folder_wins(tmp_path: Path) -> None:
    process = start(tmp_path, sizing_s=0, BERT_SERVE_MEASURE_CACHE="/elsewhere")
    wait_for(tmp_path, "serve")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert (tmp_path / "measure-cache").read_text().strip() == "/elsewhere"
