"""The measuring harness's turn-taking: a peer whose idle processes use CPU is paused
(SIGSTOP) while another endpoint is measured, and always resumed."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from lab.measure import Endpoint, its_turn


def stopped(pid: int, expected: bool) -> bool:
    """Whether the process is stopped, once it settles on ``expected`` (within 2 s): a
    signal takes effect asynchronously, and a resumed process may pass through other states
    (disk-sleep, running) before it sleeps again."""
    deadline = time.monotonic() + 2
    while True:
        is_stopped = psutil.Process(pid).status() == psutil.STATUS_STOPPED
        if is_stopped == expected or time.monotonic() > deadline:
            return is_stopped
        time.sleep(0.02)


def test_a_pausable_peer_sleeps_through_the_others_turns_and_runs_in_its_own() -> None:
    peer_process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        peer = Endpoint("peer", "http://127.0.0.1:1/", {}, None, peer_process.pid)
        server = Endpoint("server", "http://127.0.0.1:2/", {})
        with its_turn(server, [server, peer]):
            assert stopped(peer_process.pid, expected=True)
        assert not stopped(peer_process.pid, expected=False)
        with its_turn(peer, [server, peer]):
            assert not stopped(peer_process.pid, expected=False)
        with pytest.raises(RuntimeError), its_turn(server, [server, peer]):
            assert stopped(peer_process.pid, expected=True)
            raise RuntimeError("a failed measurement")
        assert not stopped(peer_process.pid, expected=False)
    finally:
        peer_process.kill()
        peer_process.wait(10)
