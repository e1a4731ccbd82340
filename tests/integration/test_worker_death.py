"""A worker killed while its frontend thread is still collecting a batch, on a real server.

TorchServe 0.12 drops the requests that thread had collected, without any answer
(`BatchAggregator.cleanJobs()`; docs/chaos/README.md, "When a worker dies"). A raw HTTP
request then waits until its own timeout; `bert_serve.Client` gives up on the attempt after its per-attempt
deadline, sends it again, and the restarted worker answers. `maxBatchDelay` is 3 s here (one
worker), so the collecting window is wide enough to kill the worker inside it every time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from bert_serve_server.control import Server, running, wait_ready

from bert_serve import Client
from tests.integration.conftest import stated_settings

BATCH_DELAY_MS = 3000
INSIDE_THE_WINDOW_S = 1.0
ATTEMPT_TIMEOUT_S = 15.0
POSITIVE = "An absolute delight from start to finish."


@pytest.fixture(scope="module")
def slow_batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(
        stated_settings(max_batch_delay=BATCH_DELAY_MS),
        state_dir=tmp_path_factory.mktemp("worker-death"),
    ) as server:
        yield server


def killed_while_collecting(server: Server, send: Callable[[], Any]) -> Any:
    """Send, then SIGKILL the worker while its thread waits for batch-mates; the send's result."""
    wait_ready(server, 180)
    pid = server.worker_pid()
    assert pid is not None
    with ThreadPoolExecutor(max_workers=1) as pool:
        sent = pool.submit(send)
        time.sleep(INSIDE_THE_WINDOW_S)
        server.kill_worker(pid)
        return sent.result()


def test_torchserve_answers_nothing_to_a_request_its_dying_worker_collected(
    slow_batching_server,
) -> None:
    """Why every client needs a timeout: this request gets no answer at all."""
    url = slow_batching_server.predict_url
    headers = slow_batching_server.headers() | {"Content-Type": "text/plain"}
    with pytest.raises(requests.ReadTimeout):
        killed_while_collecting(
            slow_batching_server,
            lambda: requests.post(url, data=POSITIVE.encode(), headers=headers, timeout=20),
        )


def test_the_client_retries_after_its_deadline_and_gets_the_answer(slow_batching_server) -> None:
    client = Client(
        slow_batching_server.inference_url,
        token=slow_batching_server.key("inference"),
        timeout=ATTEMPT_TIMEOUT_S,
    )
    started = time.monotonic()
    prediction = killed_while_collecting(slow_batching_server, lambda: client.classify(POSITIVE))
    assert prediction.label == "positive"
    assert time.monotonic() - started >= ATTEMPT_TIMEOUT_S  # the first attempt was never answered
