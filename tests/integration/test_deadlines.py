"""Deadlines on a real TorchServe: a request whose deadline passed while it queued answers 504
``deadline_exceeded`` and is not forwarded; one without a stamp, or within its deadline, is
answered as usual (docs/deadlines.md)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from harness.batchlog import LogWindow
from harness.config import models_entry
from harness.server import Server, running

EXPIRED_LINE = re.compile(r"batch_size=(\d+) valid=(\d+) rejected=(\d+) .* expired=(\d+)")


def post(server: Server, text: str, **headers: str) -> requests.Response:
    headers = server.headers() | {"Content-Type": "text/plain"} | headers
    return requests.post(server.predict_url, data=text.encode(), headers=headers, timeout=60)


def test_an_old_stamp_answers_504_and_a_fresh_one_as_if_unstamped(server: Server) -> None:
    text = "An absolute delight from start to finish."
    plain = post(server, text)
    late = post(server, text, **{"X-Request-Start": f"t={time.time() - 10:.3f}"})
    fresh = post(
        server,
        text,
        **{"X-Request-Start": f"t={time.time():.3f}", "X-Request-Timeout": "30"},
    )
    grpc_style = post(
        server, text, **{"X-Request-Start": f"{time.time() * 1000:.0f}", "grpc-timeout": "30S"}
    )
    assert plain.status_code == 200
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "deadline_exceeded"
    for answered in (fresh, grpc_style):
        assert answered.status_code == 200
        assert answered.json()["scores"] == plain.json()["scores"]


def test_requests_queued_behind_a_stopped_worker_expire_unworked(tmp_path) -> None:
    """Stamped requests with a 0.3 s wait, held 2 s behind a stopped worker, answer 504 and
    reach no forward pass; an unstamped one sent with them is answered 200."""
    one_worker = {"models": models_entry(workers=1)}
    with running(one_worker, state_dir=tmp_path / "state") as server:
        assert post(server, "warm up").status_code == 200
        stopped = server.worker_pid()
        assert stopped is not None
        try:
            with LogWindow(server.model_log) as window, ThreadPoolExecutor(8) as pool:
                server.kill_worker(stopped, signal.SIGSTOP)
                stamped = [
                    pool.submit(
                        post,
                        server,
                        f"impatient {i}",
                        **{"X-Request-Start": f"t={time.time():.3f}", "X-Request-Timeout": "0.3"},
                    )
                    for i in range(6)
                ]
                patient = pool.submit(post, server, "patient, no stamp")
                time.sleep(2)
                server.kill_worker(stopped, signal.SIGCONT)
                answers = [future.result() for future in stamped]
                assert patient.result().status_code == 200
            assert [a.status_code for a in answers] == [504] * 6
            assert {a.json()["error"]["code"] for a in answers} == {"deadline_exceeded"}
            deadline = time.monotonic() + 10
            lines: list[tuple[int, ...]] = []
            while time.monotonic() < deadline:
                lines = [tuple(map(int, m.groups())) for m in EXPIRED_LINE.finditer(window.read())]
                if sum(line[3] for line in lines) >= 6 and sum(line[1] for line in lines) >= 1:
                    break
                time.sleep(0.2)
            assert sum(line[3] for line in lines) == 6, lines
            assert sum(line[1] for line in lines) == 1, lines
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)  # the process this test stopped


def test_requests_without_a_start_stamp_are_dated_by_the_frontends_queue_time(tmp_path) -> None:
    """Requests that only say how long they wait (X-Request-Timeout: 0.3, no start stamp),
    held 2 s behind a stopped worker: once an answered batch has shown the frontend's queue
    time (handler.queue_age), the full batches behind it answer 504 unworked, with Retry-After;
    every request is answered 200 or 504."""
    small_batches = {"models": models_entry(batch_size=4, max_batch_delay=200, workers=1)}
    with running(small_batches, state_dir=tmp_path / "state") as server:
        assert post(server, "warm up").status_code == 200
        stopped = server.worker_pid()
        assert stopped is not None
        try:
            with ThreadPoolExecutor(12) as pool:
                server.kill_worker(stopped, signal.SIGSTOP)
                waiting = [
                    pool.submit(post, server, f"says 0.3 s {i}", **{"X-Request-Timeout": "0.3"})
                    for i in range(12)
                ]
                time.sleep(2)
                server.kill_worker(stopped, signal.SIGCONT)
                answers = [future.result() for future in waiting]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)  # the process this test stopped
        statuses = [answer.status_code for answer in answers]
        assert set(statuses) <= {200, 504}, statuses
        refused = [answer for answer in answers if answer.status_code == 504]
        assert len(refused) >= 4, statuses
        assert {answer.json()["error"]["code"] for answer in refused} == {"deadline_exceeded"}
        assert {answer.headers.get("Retry-After") for answer in refused} == {"1"}


def test_a_frontend_refusing_for_a_full_queue_puts_the_workers_in_overload_mode(tmp_path) -> None:
    """A queue of 8, its worker stopped, 300 plain requests: the frontend refuses the excess
    with 503. The next full batch's read of the metrics endpoint sees those refusals (its
    ``Requests5XX`` against the workers' 504s) and the batch runs overloaded (its log line
    says ``overloaded=1``); every request is answered 200, 503 or 504."""
    config = {
        "models": models_entry(batch_size=4, max_batch_delay=200, workers=1),
        "job_queue_size": "8",
    }
    with running(config, state_dir=tmp_path / "state") as server:
        with ThreadPoolExecutor(64) as pool:
            with LogWindow(server.model_log) as warm_log:
                for _ in range(10):  # until a full batch has read the counters once before
                    warm = [pool.submit(post, server, f"warm up {i}") for i in range(4)]
                    assert [f.result().status_code for f in warm] == [200] * 4
                    time.sleep(0.3)
                    if re.search(r"queue_age_ms=\d", warm_log.read()):
                        break
            time.sleep(0.6)  # readings closer than OVERLOAD_WINDOW_S are not compared
            stopped = server.worker_pid()
            assert stopped is not None
            try:
                with LogWindow(server.model_log) as window:
                    server.kill_worker(stopped, signal.SIGSTOP)
                    flood = [pool.submit(post, server, f"flood {i}") for i in range(300)]
                    time.sleep(0.5)
                    server.kill_worker(stopped, signal.SIGCONT)
                    statuses = [future.result().status_code for future in flood]
                    deadline = time.monotonic() + 10
                    log = window.read()
                    while "overloaded=1" not in log and time.monotonic() < deadline:
                        time.sleep(0.2)
                        log = window.read()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stopped, signal.SIGCONT)  # the process this test stopped
    assert set(statuses) <= {200, 503, 504}, statuses
    assert statuses.count(503) >= 200, statuses
    assert "overloaded=1" in log, log[-2000:]
