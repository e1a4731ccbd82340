"""Tuner: sweep batch size x max batch delay (and workers x threads) under the same load, and
recommend the config with the most requests/s whose p99 latency meets a target.

Every config runs on its own TorchServe (free 127.0.0.1 ports, stopped afterwards), with the
benchmark's corpus and closed-loop load. Writes ``results.json``, ``tune.png`` and
``recommended.properties`` (a ready ``models=`` line for config/config.properties) into --out.

    python scripts/tune.py --p99-ms 200 --out docs/tune
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bert_serve.harness.archive import package_variant
from bert_serve.harness.config import ROOT, models_entry
from bert_serve.harness.corpus import make_corpus
from bert_serve.harness.measure import Loads, measure_config
from bert_serve.harness.reports import plot_tune, recommend, tune_snippet


def grid(batch_sizes: list[int], delays: list[int]) -> list[dict[str, int]]:
    """Batch size x delay at 2 workers x 1 thread (the default), then workers x threads at b16."""
    configs = [
        {"batch_size": b, "delay_ms": d, "workers": 2, "threads": 1}
        for b in batch_sizes
        for d in delays
    ]
    middle = delays[len(delays) // 2]
    configs += [
        {"batch_size": 16, "delay_ms": middle, "workers": w, "threads": t}
        for w, t in ((1, 2), (1, 1))
    ]
    return configs


def measure(config: dict[str, int], store: Path, corpus: list[str], loads: Loads) -> dict[str, Any]:
    """One config on its own server, from the store whose .mar has its torch_threads."""
    name = f"b{config['batch_size']} d{config['delay_ms']} w{config['workers']}t{config['threads']}"
    overrides = {
        "model_store": str(store),
        "models": models_entry(config["batch_size"], config["delay_ms"], config["workers"]),
    }
    measured = measure_config(name, overrides, corpus, loads)
    return {"config": config, "name": name, **measured["by_concurrency"][str(loads.levels[0])]}


def sweep(configs: list[dict[str, int]], corpus: list[str], loads: Loads) -> list[dict[str, Any]]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="tune-stores-") as stores:
        for threads in sorted({config["threads"] for config in configs}):
            store = Path(stores) / f"threads{threads}"
            package_variant(store, handler_changes={"torch_threads": threads})
        for number, config in enumerate(configs, start=1):
            print(f"[tune] {number}/{len(configs)}: {config}", file=sys.stderr)
            store = Path(stores) / f"threads{config['threads']}"
            runs.append(measure(config, store, corpus, loads))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--p99-ms", type=float, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "tune")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--delays", type=int, nargs="+", default=[5, 20, 50])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    loads = Loads([args.concurrency], args.seconds, args.warmup)
    runs = sweep(grid(args.batch_sizes, args.delays), make_corpus(), loads)
    best = recommend(runs, args.p99_ms)
    results = {
        "command": f"make tune P99_MS={args.p99_ms:g}",
        "concurrency": args.concurrency,
        "seconds_per_config": args.seconds,
        "p99_target_ms": args.p99_ms,
        "runs": runs,
        "recommended": best,
    }
    snippet = tune_snippet(best, args.p99_ms, args.concurrency)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "recommended.properties").write_text(snippet)
    plot_tune(runs, args.p99_ms, args.out)
    print(snippet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
