"""Each answer carries where its time went in the worker (handler.deadline's headers out), set
per index."""

from __future__ import annotations

import json

import pytest

from handler.deadline import (
    BATCH_SIZE,
    COMPUTE_TIME,
    INFERENCE_TIME,
    QUEUE_TIME,
    TIMING_HEADERS,
    TOKENIZATION_TIME,
    timing_headers,
)
from handler.values import BatchStats
from tests.worker_harness import Sent, predict

RECEIVED = 100.0
STATS = BatchStats(
    texts=3,
    sub_batches=[2, 1],
    tokenize_ms=2.0,
    forward_started=[RECEIVED + 0.010, RECEIVED + 0.030],
    sub_batch_forward_ms=[15.0, 40.0],
    sub_batch_of=[(0,), (1,), (0,)],
    handler_ms=75.0,
)


def test_headers_follow_each_request_into_its_own_sub_batches() -> None:
    """Request 0 rode in sub-batch 0, request 2 in both (a list), request 1 had no text."""
    headers = [dict(h) for h in timing_headers(3, [0, 2, 2], STATS, RECEIVED)]
    assert headers[0] == {
        COMPUTE_TIME: "75.000",
        BATCH_SIZE: "3",
        TOKENIZATION_TIME: "2.000",
        QUEUE_TIME: "8.000",
        INFERENCE_TIME: "15.000",
    }
    assert headers[1] == {COMPUTE_TIME: "75.000", BATCH_SIZE: "3"}
    assert headers[2][QUEUE_TIME] == "8.000"
    assert headers[2][INFERENCE_TIME] == "55.000"


def test_a_failed_classification_gives_only_the_batch_wide_headers() -> None:
    """The pipeline replaces the stats of a failed batch: nothing maps texts to forwards."""
    headers = timing_headers(2, [0, 1], BatchStats(texts=2, handler_ms=3.0), RECEIVED)
    assert [dict(h) for h in headers] == [{COMPUTE_TIME: "3.000", BATCH_SIZE: "2"}] * 2


@pytest.fixture(scope="module")
def split_worker(tiny_worker):
    return tiny_worker(max_batch_tokens=128)


def test_the_worker_sends_each_answer_its_headers(split_worker) -> None:
    """Through TorchServe's worker code: the headers reach the response frame per index,
    as milliseconds that add up within the handler's time, and a rejected request gets only
    the batch-wide ones."""
    sent = [
        Sent(b"short"),
        Sent(b"   "),
        Sent(b"word " * 60),
        Sent(json.dumps({"texts": ["tiny", "word " * 60]}).encode(), "application/json"),
    ]
    answers = predict(split_worker.service, sent)
    assert [a.status for a in answers] == [200, 400, 200, 200]
    headers = [dict(a.headers) for a in answers]
    for index in (0, 2, 3):
        assert set(TIMING_HEADERS) <= set(headers[index]), headers[index]
        assert headers[index][BATCH_SIZE] == "4"
        values = {name: float(headers[index][name]) for name in TIMING_HEADERS[:4]}
        assert values[INFERENCE_TIME] > 0 and values[TOKENIZATION_TIME] > 0
        parts = values[TOKENIZATION_TIME] + values[QUEUE_TIME] + values[INFERENCE_TIME]
        assert parts <= values[COMPUTE_TIME] + 0.01
    assert set(headers[1]) & set(TIMING_HEADERS) == {COMPUTE_TIME, BATCH_SIZE}
    # Three texts fit 128 tokens together, the two 62-token ones go on their own: the list
    # request rode in both forwards, the short text in the first only.
    assert float(headers[3][INFERENCE_TIME]) > float(headers[0][INFERENCE_TIME])
    assert float(headers[2][QUEUE_TIME]) > float(headers[0][QUEUE_TIME])
