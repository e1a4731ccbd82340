"""The handler's counters appear on TorchServe's Prometheus endpoint and move by the right amounts."""

from __future__ import annotations

from metrics_summary import scrape, summary

from tests.integration.test_serving import post


def test_metrics_move_by_the_traffic_sent(server, predict_url) -> None:
    """3 valid texts (1 truncated), 2 empty, 1 bad JSON, sent one by one -> exact counter deltas."""
    before = scrape(server.metrics_url)
    for data, content_type in [
        (b"lovely", "text/plain"),
        (b"dreadful", "text/plain"),
        (b"great " * 300, "text/plain"),
        (b"", "text/plain"),
        (b" ", "text/plain"),
        (b"{", "application/json"),
    ]:
        post(server, predict_url, data, content_type)
    after = scrape(server.metrics_url)

    def delta(name: str, reason: str = "") -> float:
        return after.get((name, reason), 0.0) - before.get((name, reason), 0.0)

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
