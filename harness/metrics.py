"""The handler's metrics as a live summary: TorchServe's Prometheus endpoint, scraped twice and
read as rates over the interval (``make metrics``)."""

from __future__ import annotations

import re

import requests

from harness.config import MODEL_NAME

SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")
Series = dict[tuple[str, str], float]


def parse_metrics(text: str, model: str = MODEL_NAME) -> Series:
    """{(metric, Reason label or ""): value} summed over the model's series."""
    values: Series = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        labels = match.group(2)
        if f'ModelName="{model}"' not in labels and f'model_name="{model}"' not in labels:
            continue
        reason = re.search(r'Reason="([^"]*)"', labels)
        key = (match.group(1), reason.group(1) if reason else "")
        values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


def scrape(metrics_url: str) -> Series:
    return parse_metrics(requests.get(f"{metrics_url}/metrics", timeout=10).text)


def summary(before: Series, after: Series, seconds: float) -> str:
    def delta(name: str, reason: str = "") -> float:
        return after.get((name, reason), 0.0) - before.get((name, reason), 0.0)

    batches = delta("Batches")
    per_batch = batches or 1.0
    rejected = {
        reason: delta("ItemsRejected", reason) for name, reason in after if name == "ItemsRejected"
    }
    rejected_text = (
        ", ".join(f"{reason} {count:.0f}" for reason, count in sorted(rejected.items()) if count)
        or "none"
    )
    padded = delta("PaddedTokens")
    requests_seen = delta("ts_inference_requests_total")
    queue_ms = delta("ts_queue_latency_microseconds") / 1000 / (requests_seen or 1.0)
    return (
        f"{batches / seconds:6.1f} batches/s | batch size {delta('BatchItems') / per_batch:5.1f} | "
        f"forwards/batch {delta('SubBatches') / per_batch:4.1f} | accepted {delta('ItemsAccepted') / seconds:6.1f}/s | "
        f"truncated {delta('ItemsTruncated'):.0f} | padding eff {delta('RealTokens') / padded if padded else 1.0:4.2f} | "
        f"tokenize {delta('TokenizeMs') / per_batch:5.1f} ms | forward {delta('ForwardMs') / per_batch:6.1f} ms | "
        f"queue {queue_ms:6.1f} ms | rejected: {rejected_text}"
    )
