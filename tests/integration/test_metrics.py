"""The handler's counters and histograms appear on TorchServe's Prometheus endpoint and move by
the right amounts; the timing headers reach the client."""

from __future__ import annotations

import time

from bert_serve_server.live_metrics import histogram_delta, scrape, summary

from handler.deadline import BATCH_SIZE, COMPUTE_TIME, INFERENCE_TIME, TIMING_HEADERS
from tests.integration.test_serving import post


def settled(metrics_url: str, seconds: float = 10) -> dict:
    """A scrape after two consecutive ones agree: earlier tests' metric lines have landed."""
    previous = scrape(metrics_url)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.5)
        current = scrape(metrics_url)
        if current == previous:
            return current
        previous = current
    return previous


def test_metrics_move_by_the_traffic_sent(server, predict_url) -> None:
    """3 valid texts (1 of 300 words: 3 windows), 2 empty, 1 bad JSON, sent one by one -> exact
    counter deltas."""
    before = settled(server.metrics_url)
    for data, content_type in [
        (b"lovely", "text/plain"),
        (b"dreadful", "text/plain"),
        (b"great " * 300, "text/plain"),
        (b"", "text/plain"),
        (b" ", "text/plain"),
        (b"{", "application/json"),
    ]:
        post(server, predict_url, data, content_type)
    expected = {
        ("Batches", ""): 6,
        ("BatchItems", ""): 6,
        ("ItemsAccepted", ""): 3,
        ("ItemsTruncated", ""): 0,
        ("ItemsWindowed", ""): 1,
        ("Windows", ""): 5,
        ("ItemsRejected", "empty_text"): 2,
        ("ItemsRejected", "invalid_json"): 1,
    }

    def delta(name: str, reason: str = "") -> float:
        return after.get((name, reason), 0.0) - before.get((name, reason), 0.0)

    # The frontend reads the workers' metric lines asynchronously: a batch's lines may land a
    # moment after its response, so poll (bounded) until the counters reach what was sent.
    deadline = time.monotonic() + 15
    after = scrape(server.metrics_url)
    while (
        any(delta(*key) != value for key, value in expected.items()) and time.monotonic() < deadline
    ):
        time.sleep(0.25)
        after = scrape(server.metrics_url)

    assert delta("Batches") == 6
    assert delta("BatchItems") == 6
    assert delta("ItemsAccepted") == 3
    assert delta("ItemsTruncated") == 0
    assert delta("ItemsWindowed") == 1 and delta("Windows") == 5
    assert delta("ItemsRejected", "empty_text") == 2
    assert delta("ItemsRejected", "invalid_json") == 1
    assert 3 <= delta("SubBatches") <= 5  # the 3 windows in one pass or split by the budget
    assert delta("PaddedTokens") >= delta("RealTokens") > 128
    assert delta("ForwardMs") > 0 and delta("TokenizeMs") > 0
    assert "rejected: empty_text 2, invalid_json 1" in summary(before, after, 1.0)


def histogram_count(series: dict, name: str) -> float:
    """Observations so far: the +Inf bucket (every observation falls in it)."""
    return series.get((f"{name}_bucket", "le=+Inf"), 0.0)


def test_timing_headers_arrive_and_the_histograms_move_by_the_traffic_sent(
    server, predict_url
) -> None:
    """Through the real frontend: every answer carries the timing headers (a rejected one
    the batch-wide ones), and each handler histogram counts exactly what was sent: one
    observation per batch (per forward pass for ForwardSeconds); sent one by one, each
    request is its own batch."""
    before = settled(server.metrics_url)
    answers = [post(server, predict_url, text, "text/plain") for text in (b"lovely", b"dull")]
    rejected = post(server, predict_url, b"   ", "text/plain")
    assert [a.status_code for a in answers] == [200, 200] and rejected.status_code == 400
    for answer in answers:
        for name in TIMING_HEADERS:
            assert name in answer.headers, (name, dict(answer.headers))
        assert answer.headers[BATCH_SIZE] == "1"
        assert float(answer.headers[INFERENCE_TIME]) > 0
        assert float(answer.headers[COMPUTE_TIME]) >= float(answer.headers[INFERENCE_TIME])
    assert COMPUTE_TIME in rejected.headers and INFERENCE_TIME not in rejected.headers
    expected = {"HandlerSeconds": 3, "BatchSizeHundreds": 3, "ForwardSeconds": 2}
    expected["BatchTokensThousands"] = 2

    def delta(name: str) -> float:
        return histogram_count(after, name) - histogram_count(before, name)

    deadline = time.monotonic() + 15
    after = scrape(server.metrics_url)
    while any(delta(n) != v for n, v in expected.items()) and time.monotonic() < deadline:
        time.sleep(0.25)
        after = scrape(server.metrics_url)
    assert {name: delta(name) for name in expected} == expected
    # Each request was a batch of one: 0.01 hundreds, in the 0.01 bucket and not below.
    sizes = dict(histogram_delta(before, after, "BatchSizeHundreds"))
    assert sizes[0.005] == 0 and sizes[0.01] == 3
    text = summary(before, after, 1.0)
    assert "batch size p50 <= 1 p99 <= 1 |" in text, text
    assert "handler p50 " in text and "forward p50 " in text
