"""Benchmark: served throughput and latency, side by side, in one run.

Scenarios, all on the same model and the same deterministic mixed-length corpus:

- ``ceiling``: tokenization + forward with no HTTP, in as many single-threaded processes as
  the default config has workers, at each batch size with length grouping; the best is the
  in-process ceiling;
- ``torchserve_bs1``: TorchServe with batchSize 1, the one-request-at-a-time path;
- ``torchserve_batched``: TorchServe with the default config/config.properties (fp32);
- ``torchserve_bf16``: the same with ``precision: bf16`` packed in the .mar (the fast mode of
  ``make serve PRECISION=bf16``), when this CPU has native bf16;
- ``precision``: fp32 against bf16 on the whole corpus through the handler's classify
  (``lab.compare``): speed, largest score change, labels unchanged;
- ``litserve`` and ``litserve_tuned``: LitServe servers of the same model
  (``scripts/litserve_peer.py``), what users pick instead: out of the box (one worker, no
  batching), and configured like the default server's settings in force (workers, torch
  threads, batch size and delay, as `make status` shows them);
- ``client_lists``: on the default server, the Python client's ``classify_many`` (list
  requests of up to 64 texts, a few in flight) over a fixed set of texts.

The experiments live in ``lab.bench``. Each served scenario has its own server on free
127.0.0.1 ports; all run at once, and at each concurrency level each gets a warm-up and a
bounded closed loop in turn (so a slow spell of a shared machine falls on all alike); all
are stopped at the end. Writes
``results.json`` and ``serving.png`` into ``--out`` (docs/bench/README.md reads them), and
prints the issue's bars, each with its value and whether it is met.

    python scripts/bench.py --out docs/bench            # the full run (about 10 minutes)
    python scripts/bench.py --smoke --out /tmp/bench    # a few seconds, to keep the tool working
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bert_serve_server import sizing
from bert_serve_server.archive import DEFAULT_MODEL_DIR
from bert_serve_server.config import ROOT

from lab import bench
from lab.corpus import corpus_stats, make_corpus
from lab.machine import describe
from lab.reports import bench_ratios, plot_bench


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--seconds", type=float, default=8, help="measured time per concurrency level"
    )
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument(
        "--smoke", action="store_true", help="a few seconds: ceiling and batched TorchServe only"
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the workers and the in-process runs compute (auto: cuda where there is one)",
    )
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if sizing.gpu_count() else "cpu"
    if args.smoke:
        args.seconds, args.warmup = 1.5, 0.5
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus()
    results: dict[str, Any] = {
        "command": "make bench" if not args.smoke else "python scripts/bench.py --smoke",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": describe(),
        "corpus": corpus_stats(corpus),
        "seconds_per_level": args.seconds,
    }
    plan = bench.Plan(args.model_dir, args.seconds, args.warmup, args.smoke, args.device)
    results["device"] = args.device
    results |= bench.run(plan, corpus)
    results["ratios"] = bench_ratios(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_bench(results, args.out)
    print(json.dumps(results["ratios"], indent=2))
    bench.step(f"wrote {args.out / 'results.json'} and serving.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
