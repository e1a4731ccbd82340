"""``control.stop`` ends the frontend it started, within its bound, and nothing else: against a
fake frontend (tests/fake_frontend.py) that ignores SIGTERM, exits on it, or leaves its workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from bert_serve_server import control
from bert_serve_server.control import FRONTEND_CLASS, Server, ServerError, stop

from tests.conftest import ROOT

FAKE = ROOT / "tests" / "fake_frontend.py"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def frontend(tmp_path: Path) -> Iterator[Callable[..., tuple[Server, subprocess.Popen[bytes]]]]:
    """Starts a fake frontend in ``tmp_path``; whatever a test leaves running is killed."""
    started: list[subprocess.Popen[bytes]] = []
    pids: list[int] = []

    def start(
        mode: str, workers: int = 2, own_group: bool = False
    ) -> tuple[Server, subprocess.Popen[bytes]]:
        process = subprocess.Popen(
            [sys.executable, str(FAKE), str(tmp_path), mode, str(workers), FRONTEND_CLASS],
            start_new_session=own_group,
        )
        started.append(process)
        server = Server(tmp_path, {})
        deadline = time.monotonic() + 30
        while server.pid() is None:
            assert process.poll() is None and time.monotonic() < deadline, "no fake frontend"
            time.sleep(0.05)
        pids.extend([process.pid, *(c.pid for c in psutil.Process(process.pid).children())])
        assert len(pids) == workers + 1
        return server, process

    yield start
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for process in started:
        process.wait(10)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process in the test's own process group, which no stop may touch."""
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait(10)


def test_a_frontend_that_ignores_sigterm_is_killed_after_the_bound_with_its_workers(
    frontend: Callable[..., tuple[Server, subprocess.Popen[bytes]]],
    bystander: subprocess.Popen[bytes],
) -> None:
    """In the caller's own process group (as `torchserve --start` leaves it) only the frontend
    and the workers it started are killed, by pid: not the group, which holds this test."""
    server, process = frontend("ignore")
    workers = [child.pid for child in psutil.Process(process.pid).children()]
    began = time.monotonic()
    report = stop(server, timeout=1)
    took = time.monotonic() - began
    assert 1 <= took < 1 + control.KILL_WAIT_S
    assert not report.exited_on_term and report.killed_group is None
    assert set(report.killed) == {process.pid, *workers}
    assert not alive(process.pid) and not any(alive(pid) for pid in workers)
    assert bystander.poll() is None, "a process the frontend did not start was signalled"
    said = str(report)
    assert f"pid {process.pid}) did not exit within 1 s of SIGTERM, so it was killed" in said
    assert all(str(pid) in said for pid in workers)
    assert not (server.tmp_dir / ".model_server.pid").exists()


def test_a_frontend_in_its_own_process_group_is_killed_with_its_group(
    frontend: Callable[..., tuple[Server, subprocess.Popen[bytes]]],
    bystander: subprocess.Popen[bytes],
) -> None:
    server, process = frontend("ignore", own_group=True)
    workers = [child.pid for child in psutil.Process(process.pid).children()]
    report = stop(server, timeout=0.5)
    assert report.killed_group == process.pid and f"process group {process.pid}" in str(report)
    assert not alive(process.pid) and not any(alive(pid) for pid in workers)
    assert bystander.poll() is None


def test_a_frontend_that_exits_on_sigterm_is_not_killed(
    frontend: Callable[..., tuple[Server, subprocess.Popen[bytes]]],
) -> None:
    server, process = frontend("exit")
    report = stop(server, timeout=30)
    assert report.exited_on_term and report.killed == () and report.seconds < 30
    assert process.wait(10) == 0
    assert str(report).startswith(f"TorchServe stopped: its frontend (pid {process.pid}) exited")


def test_workers_left_running_by_an_exited_frontend_are_killed(
    frontend: Callable[..., tuple[Server, subprocess.Popen[bytes]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(control, "WORKERS_GRACE_S", 0.5)
    server, process = frontend("orphan")
    workers = [child.pid for child in psutil.Process(process.pid).children()]
    report = stop(server, timeout=30)
    assert report.exited_on_term and set(report.killed) == set(workers)
    assert not any(alive(pid) for pid in workers)
    assert "were killed" in str(report)


def test_the_stop_bound_is_bert_serve_stop_s(
    frontend: Callable[..., tuple[Server, subprocess.Popen[bytes]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The variable bounds the frontend's exit, not only a command that asks for it."""
    monkeypatch.setenv("BERT_SERVE_STOP_S", "0.5")
    server, process = frontend("ignore", workers=0)
    began = time.monotonic()
    report = stop(server)
    assert report.bound == 0.5 and time.monotonic() - began < 0.5 + control.KILL_WAIT_S
    assert not alive(process.pid)
    for wrong in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("BERT_SERVE_STOP_S", wrong)
        with pytest.raises(ServerError, match="BERT_SERVE_STOP_S"):
            control.stop_bound()
    monkeypatch.delenv("BERT_SERVE_STOP_S")
    assert control.stop_bound() == control.DEFAULT_STOP_S


def test_a_pid_file_naming_another_process_stops_nothing(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / ".model_server.pid").write_text(str(bystander.pid))
    report = stop(Server(tmp_path, {}), timeout=0.1)
    assert report.pid is None and str(report) == "TorchServe is not running"
    assert bystander.poll() is None


def test_the_stop_command_prints_what_it_did(
    frontend: Callable[..., tuple[Server, subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    """`python -m bert_serve_server stop --timeout S` (make stop) says whether it killed."""
    (tmp_path / "config.properties").write_text(
        "inference_address=http://127.0.0.1:8080\nmanagement_address=http://127.0.0.1:8081\n"
    )
    _, process = frontend("ignore", workers=1)
    result = subprocess.run(
        [sys.executable, "-m", "bert_serve_server", "stop", "--state-dir", str(tmp_path)]
        + ["--timeout", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"(pid {process.pid}) did not exit within 0.5 s of SIGTERM" in result.stdout
    assert process.wait(10) == -signal.SIGKILL
