"""A live summary of the handler's metrics while traffic runs (``make metrics``).

Scrapes TorchServe's Prometheus endpoint every ``--every`` seconds for at most ``--seconds``
and prints, per interval: batches/s, mean formed batch size, forward passes per batch,
accepted/s, rejected/s by reason, truncated, padding efficiency, tokenize and forward
milliseconds per batch, and TorchServe's mean queue time.

    python scripts/metrics_summary.py [--state-dir .run] [--seconds 60] [--every 2]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import requests
import torchserve_ctl

SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")
Series = dict[tuple[str, str], float]


def parse_metrics(text: str, model: str = "bert") -> Series:
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-dir", type=Path, default=torchserve_ctl.DEFAULT_STATE_DIR)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=float, default=2)
    args = parser.parse_args()
    server = torchserve_ctl.server_for(args.state_dir.resolve())
    deadline = time.monotonic() + args.seconds
    previous, previous_time = scrape(server.metrics_url), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(args.every)
        current, now = scrape(server.metrics_url), time.monotonic()
        print(summary(previous, current, now - previous_time), flush=True)
        previous, previous_time = current, now
    return 0


if __name__ == "__main__":
    sys.exit(main())
