"""The handler's metrics as a live summary: TorchServe's Prometheus endpoint, scraped twice and
read as rates over the interval (``make metrics``).

Every ``--every`` seconds for at most ``--seconds``, per served model (one line each, its name
first): batches/s, mean formed batch size, forward passes per batch, accepted/s, rejected/s by
reason, truncated, padding efficiency, tokenize and forward milliseconds per batch,
TorchServe's mean queue time, and p50/p99 of the handler's histograms (handler time, forward
time, batch size, batch tokens) as the bucket that holds each.

    python -m bert_serve_server metrics [--state-dir .run] [--seconds 60] [--every 2]
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import requests

from bert_serve_server.config import MODEL_NAME
from bert_serve_server.ready import SAMPLE

Series = dict[tuple[str, str], float]


HISTOGRAM_SCALES = {
    "HandlerSeconds": (1000.0, "ms"),
    "ForwardSeconds": (1000.0, "ms"),
    "BatchSizeHundreds": (100.0, ""),
    "BatchTokensThousands": (1000.0, ""),
}
"""The handler's histograms (handler/metrics.py), and the factor back to their natural unit."""
SHOWN_AS = {
    "HandlerSeconds": "handler",
    "ForwardSeconds": "forward",
    "BatchSizeHundreds": "batch size",
    "BatchTokensThousands": "batch tokens",
}


def parse_metrics(text: str, model: str = MODEL_NAME, version: str | None = None) -> Series:
    """{(metric, Reason label or ""): value} summed over the model's series (of ``version``
    alone when given); a histogram's buckets as (``<name>_bucket``, ``le=<upper bound>``)."""
    values: Series = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        labels = match.group(2)
        if f'ModelName="{model}"' not in labels and f'model_name="{model}"' not in labels:
            continue
        if version is not None and not (
            f'ModelVersion="{version}"' in labels or f'model_version="{version}"' in labels
        ):
            continue
        reason = re.search(r'Reason="([^"]*)"', labels)
        bound = re.search(r'le="([^"]*)"', labels)
        second = f"le={bound.group(1)}" if bound else (reason.group(1) if reason else "")
        key = (match.group(1), second)
        values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


def scrape(metrics_url: str, model: str = MODEL_NAME) -> Series:
    return scrape_models(metrics_url, [model])[model]


def scrape_models(metrics_url: str, models: list[str]) -> dict[str, Series]:
    """Each model's series, from one scrape."""
    text = requests.get(f"{metrics_url}/metrics", timeout=10).text
    return {model: parse_metrics(text, model) for model in models}


def buckets(series: Series, name: str) -> list[tuple[float, float]]:
    """A histogram's (upper bound, cumulative count), ascending, +Inf last."""
    found = [
        (float(second[3:]), value)
        for (metric, second), value in series.items()
        if metric == f"{name}_bucket" and second.startswith("le=")
    ]
    return sorted(found)


def quantile(cumulative: list[tuple[float, float]], q: float) -> tuple[float, float] | None:
    """The bucket that holds the q-quantile, as (lower bound, upper bound); None without
    data. Shown as "<= upper bound": the buckets say no more (Prometheus'
    ``histogram_quantile`` interpolates linearly inside that bucket, which reads a batch of
    one as 0.75)."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower = 0.0
    for bound, count in cumulative:
        if count >= rank:
            return lower, bound
        lower = bound
    return lower, float("inf")


def bucket_text(bounds: tuple[float, float], scale: float, unit: str) -> str:
    lower, upper = bounds
    if upper == float("inf"):
        return f"> {lower * scale:.4g}{unit}"
    return f"<= {upper * scale:.4g}{unit}"


def histogram_delta(before: Series, after: Series, name: str) -> list[tuple[float, float]]:
    """The buckets of what was observed between two scrapes."""
    earlier = dict(buckets(before, name))
    return [(bound, count - earlier.get(bound, 0.0)) for bound, count in buckets(after, name)]


def quantiles_text(before: Series, after: Series) -> str:
    """p50/p99 of each handler histogram over the interval, in natural units, as the
    upper bound of the bucket that holds it."""
    parts = []
    for name, (scale, unit) in HISTOGRAM_SCALES.items():
        delta = histogram_delta(before, after, name)
        p50, p99 = quantile(delta, 0.5), quantile(delta, 0.99)
        if p50 is None or p99 is None:
            parts.append(f"{SHOWN_AS[name]} -")
            continue
        parts.append(
            f"{SHOWN_AS[name]} p50 {bucket_text(p50, scale, unit)} "
            f"p99 {bucket_text(p99, scale, unit)}"
        )
    return " | ".join(parts)


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
        f"queue {queue_ms:6.1f} ms | rejected: {rejected_text} | {quantiles_text(before, after)}"
    )


def main(argv: list[str] | None = None) -> int:
    from bert_serve_server.control import DEFAULT_STATE_DIR, server_for

    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server metrics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=float, default=2)
    args = parser.parse_args(argv)
    server = server_for(args.state_dir.resolve())
    deadline = time.monotonic() + args.seconds
    models = server.model_names()
    width = max(len(model) for model in models)
    previous, previous_time = scrape_models(server.metrics_url, models), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(args.every)
        current, now = scrape_models(server.metrics_url, models), time.monotonic()
        for model in models:
            line = summary(previous[model], current[model], now - previous_time)
            print(f"{model:<{width}} | {line}", flush=True)
        previous, previous_time = current, now
    return 0
