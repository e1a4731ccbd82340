"""The measuring harness's turn-taking: a peer whose idle processes use CPU is paused
(SIGSTOP) while another endpoint is measured, and always resumed."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from bert_serve.harness.measure import Endpoint, its_turn


def state(pid: int) -> str:
    for _ in range(50):
        status = psutil.Process(pid).status()
        if status != psutil.STATUS_RUNNING:
            return str(status)
        time.sleep(0.02)
    return str(psutil.Process(pid).status())


def test_a_pausable_peer_sleeps_through_the_others_turns_and_runs_in_its_own() -> None:
    peer_process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        peer = Endpoint("peer", "http://127.0.0.1:1/", {}, None, peer_process.pid)
        server = Endpoint("server", "http://127.0.0.1:2/", {})
        with its_turn(server, [server, peer]):
            assert state(peer_process.pid) == psutil.STATUS_STOPPED
        assert state(peer_process.pid) == psutil.STATUS_SLEEPING
        with its_turn(peer, [server, peer]):
            assert state(peer_process.pid) == psutil.STATUS_SLEEPING
        with pytest.raises(RuntimeError), its_turn(server, [server, peer]):
            raise RuntimeError("a failed measurement")
        assert state(peer_process.pid) == psutil.STATUS_SLEEPING
    finally:
        peer_process.kill()
        peer_process.wait(10)
