"""The handler's counters appear on TorchServe's Prometheus endpoint and move by the right amounts."""

from __future__ import annotations

import time

from harness.metrics import scrape, summary
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
    """3 valid texts (1 truncated), 2 empty, 1 bad JSON, sent one by one -> exact counter deltas."""
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
        ("ItemsTruncated", ""): 1,
        ("ItemsRejected", "empty_text"): 2,
        ("ItemsRejected", "invalid_json"): 1,
        ("SubBatches", ""): 3,
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
    assert delta("ItemsTruncated") == 1
    assert delta("ItemsRejected", "empty_text") == 2
    assert delta("ItemsRejected", "invalid_json") == 1
    assert delta("SubBatches") == 3
    assert delta("PaddedTokens") >= delta("RealTokens") > 128
    assert delta("ForwardMs") > 0 and delta("TokenizeMs") > 0
    assert "rejected: empty_text 2, invalid_json 1" in summary(before, after, 1.0)
