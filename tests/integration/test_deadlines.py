"""Deadlines on a real TorchServe: a request whose stated deadline passed while it queued
answers 504 ``deadline_exceeded`` and is not forwarded; one that states no wait, or is within
its deadline, is answered as usual (docs/deadlines.md)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from bert_serve_server.control import Server, running

from handler.deadline import WAIT_TIME
from lab.batchlog import LogWindow
from tests.integration.conftest import stated_settings

EXPIRED_LINE = re.compile(r"batch_size=(\d+) valid=(\d+) rejected=(\d+) .* expired=(\d+)")


def post(server: Server, text: str, **headers: str) -> requests.Response:
    headers = server.headers() | {"Content-Type": "text/plain"} | headers
    return requests.post(server.predict_url, data=text.encode(), headers=headers, timeout=60)


def test_an_old_stamp_answers_504_and_a_fresh_one_as_if_unstamped(server: Server) -> None:
    text = "An absolute delight from start to finish."
    plain = post(server, text)
    started = f"t={time.time() - 10:.3f}"
    late = post(server, text, **{"X-Request-Start": started, "X-Request-Timeout": "5"})
    patient = post(server, text, **{"X-Request-Start": started})
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
    assert late.headers.get("Retry-After") == "1"
    assert float(late.headers[WAIT_TIME]) >= 10_000 and WAIT_TIME not in plain.headers
    for answered in (fresh, grpc_style, patient):
        assert answered.status_code == 200
        assert answered.json()["scores"] == plain.json()["scores"]


def test_requests_queued_behind_a_stopped_worker_expire_unworked(tmp_path) -> None:
    """Stamped requests with a 0.3 s wait, held 2 s behind a stopped worker, answer 504 with
    the 2 s in ``x-wait-time`` and reach no forward pass; those sent with them that state no
    wait, or a wait without a start stamp, are patient: answered 200."""
    with running(stated_settings(), state_dir=tmp_path / "state") as server:
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
                patient = [
                    pool.submit(post, server, "patient, no stamp"),
                    pool.submit(
                        post, server, "no wait", **{"X-Request-Start": f"t={time.time():.3f}"}
                    ),
                    pool.submit(post, server, "no start", **{"X-Request-Timeout": "0.3"}),
                ]
                time.sleep(2)
                server.kill_worker(stopped, signal.SIGCONT)
                answers = [future.result() for future in stamped]
                assert [future.result().status_code for future in patient] == [200] * 3
            assert [a.status_code for a in answers] == [504] * 6
            assert {a.json()["error"]["code"] for a in answers} == {"deadline_exceeded"}
            assert min(float(a.headers[WAIT_TIME]) for a in answers) > 1500  # held 2 s
            deadline = time.monotonic() + 10
            lines: list[tuple[int, ...]] = []
            while time.monotonic() < deadline:
                lines = [tuple(map(int, m.groups())) for m in EXPIRED_LINE.finditer(window.read())]
                if sum(line[3] for line in lines) >= 6 and sum(line[1] for line in lines) >= 3:
                    break
                time.sleep(0.2)
            assert sum(line[3] for line in lines) == 6, lines
            assert sum(line[1] for line in lines) == 3, lines
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)  # the process this test stopped
