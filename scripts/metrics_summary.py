"""A live summary of the handler's metrics while traffic runs (``make metrics``).

Scrapes TorchServe's Prometheus endpoint every ``--every`` seconds for at most ``--seconds``
and prints, per interval and per served model (one line each, its name first): batches/s, mean formed batch size, forward passes per batch,
accepted/s, rejected/s by reason, truncated, padding efficiency, tokenize and forward
milliseconds per batch, TorchServe's mean queue time, and p50/p99 of the handler's histograms
(handler time, forward time, batch size, batch tokens) as the bucket that holds each.

    python scripts/metrics_summary.py [--state-dir .run] [--seconds 60] [--every 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bert_serve_server.control import DEFAULT_STATE_DIR, server_for
from bert_serve_server.live_metrics import scrape_models, summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=float, default=2)
    args = parser.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
