"""The handler's counters appear on TorchServe's Prometheus endpoint and move by the right amounts."""

from __future__ import annotations

import re

import requests

from tests.integration.test_serving import post

SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")


def scrape(server) -> dict[tuple[str, str], float]:
    """{(metric, reason-or-""): value} for the bert model's series."""
    text = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and 'ModelName="bert"' in match.group(2):
            reason = re.search(r'Reason="([^"]*)"', match.group(2))
            values[(match.group(1), reason.group(1) if reason else "")] = float(match.group(3))
    return values


def test_metrics_move_by_the_traffic_sent(server, predict_url) -> None:
    """3 valid texts (1 truncated), 2 empty, 1 bad JSON, sent one by one -> exact counter deltas."""
    before = scrape(server)
    for data, content_type in [
        (b"lovely", "text/plain"),
        (b"dreadful", "text/plain"),
        (b"great " * 300, "text/plain"),
        (b"", "text/plain"),
        (b" ", "text/plain"),
        (b"{", "application/json"),
    ]:
        post(server, predict_url, data, content_type)
    after = scrape(server)

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
