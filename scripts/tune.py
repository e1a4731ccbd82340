"""Tuner: the batching config that is close to the best at every load, not at one guessed load.

Every candidate (batch size, maxBatchDelay, workers x torch threads) runs on its own
TorchServe (free 127.0.0.1 ports, stopped afterwards); all run at once, idle but one, and at
each concurrency of --loads each gets the benchmark's corpus in turn, one closed loop per
level, so a slow spell of the machine does not favour whichever config ran at a quiet time. For each level the best requests/s of any
candidate is the reference; a candidate's score is its worst ratio to that reference over
all levels, and the recommendation is the candidate with the best score. A second, smaller
experiment measures what TorchServe's logging costs: the default config at --log-clients
clients with TorchServe's built-in log4j2 config and with config/log4j2.xml, alternated.

Writes ``results.json``, ``tune.png`` and ``recommended.properties`` into --out.

    python scripts/tune.py --out docs/tune                       # make tune
    python scripts/tune.py --candidates b1d0w2t1 b16d2w2t1 --loads 1 32 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bert_serve.harness.archive import package_variant
from bert_serve.harness.config import ROOT, models_entry
from bert_serve.harness.corpus import make_corpus
from bert_serve.harness.measure import Loads, endpoint, frontend_cost, interleaved, servers
from bert_serve.harness.reports import plot_tune, recommend_across_loads, tune_snippet

CANDIDATE = re.compile(r"b(\d+)d(\d+)w(\d+)t(\d+)(-own)?")
DEFAULT_CANDIDATES = [
    "b1d0w2t1-own",
    "b1d0w2t1",
    "b4d1w2t1",
    "b8d1w2t1",
    "b16d1w2t1-own",
    "b16d1w2t1",
    "b16d2w2t1",
    "b32d2w2t1",
    "b16d1w1t2",
]


def parse_candidate(name: str) -> dict[str, int]:
    """``b16d2w2t1``: batch size 16, maxBatchDelay 2 ms, 2 workers x 1 torch thread, idle
    workers lending their threads; ``b16d2w2t1-own``: each worker keeps to its own thread."""
    match = CANDIDATE.fullmatch(name)
    if not match:
        raise argparse.ArgumentTypeError(f"{name!r} is not like b16d2w2t1 or b16d2w2t1-own")
    batch_size, delay_ms, workers, threads = map(int, match.groups()[:4])
    return {
        "batch_size": batch_size,
        "delay_ms": delay_ms,
        "workers": workers,
        "threads": threads,
        "share": int(match.group(5) is None),
    }


def candidate_name(config: dict[str, int]) -> str:
    own = "" if config["share"] else "-own"
    return (
        f"b{config['batch_size']}d{config['delay_ms']}w{config['workers']}t{config['threads']}{own}"
    )


def store_name(config: dict[str, int]) -> str:
    return f"threads{config['threads']}share{config['share']}"


def sweep(configs: list[dict[str, int]], corpus: list[str], loads: Loads) -> list[dict[str, Any]]:
    """Every config on its own server (from a store whose .mar has its threads), all running
    at once and measured in turn at each load (``interleaved``)."""
    with tempfile.TemporaryDirectory(prefix="tune-stores-") as stores:
        for config in {store_name(config): config for config in configs}.values():
            package_variant(
                Path(stores) / store_name(config),
                handler_changes={
                    "torch_threads": config["threads"],
                    "share_idle_threads": bool(config["share"]),
                },
            )
        overrides = {
            candidate_name(config): {
                "model_store": str(Path(stores) / store_name(config)),
                "models": models_entry(config["batch_size"], config["delay_ms"], config["workers"]),
            }
            for config in configs
        }
        print(f"[tune] starting {len(configs)} servers", file=sys.stderr)
        with servers(overrides) as running_servers:
            endpoints = [endpoint(name, item["server"]) for name, item in running_servers.items()]
            measured = interleaved(endpoints, corpus, loads)
    return [
        {
            "name": candidate_name(config),
            "config": config,
            "by_concurrency": measured[candidate_name(config)],
        }
        for config in configs
    ]


def logging_cost(corpus: list[str], level: int, loads: Loads, rounds: int) -> dict[str, Any]:
    """The default config with TorchServe's built-in log config and with ours, alternated."""
    variants = {"builtin_log4j2": {"vmargs": ""}, "project_log4j2": {}}
    rounds_out: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for number in range(rounds):
        for name, overrides in variants.items():
            print(f"[tune] logging cost, round {number + 1}/{rounds}: {name}", file=sys.stderr)
            rounds_out[name].append(frontend_cost(name, overrides, corpus, level, loads))

    def mean(name: str, key: str) -> float:
        return round(float(sum(run[key] for run in rounds_out[name])) / rounds, 3)

    keys = ("rps", "frontend_cpu_ms_per_request", "log_bytes_per_request")
    means = {name: {key: mean(name, key) for key in keys} for name in variants}
    return {
        "concurrency": level,
        "rounds": rounds_out,
        "mean": means,
        "frontend_cpu_saved_pct": round(
            100
            * (
                1
                - means["project_log4j2"]["frontend_cpu_ms_per_request"]
                / means["builtin_log4j2"]["frontend_cpu_ms_per_request"]
            ),
            1,
        ),
        "rps_ratio": round(means["project_log4j2"]["rps"] / means["builtin_log4j2"]["rps"], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "tune")
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--seconds", type=float, default=5, help="measured seconds per load")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument(
        "--candidates",
        type=parse_candidate,
        nargs="+",
        default=[parse_candidate(name) for name in DEFAULT_CANDIDATES],
    )
    parser.add_argument("--log-clients", type=int, default=32)
    parser.add_argument("--log-rounds", type=int, default=2, help="0 skips the logging experiment")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus()
    loads = Loads(args.loads, args.seconds, args.warmup)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runs = sweep(args.candidates, corpus, loads)
    best = recommend_across_loads(runs)
    results: dict[str, Any] = {
        "command": " ".join(["python scripts/tune.py", *sys.argv[1:]]),
        "started": started,
        "loads": args.loads,
        "seconds_per_load": args.seconds,
        "runs": runs,
        "recommended": best,
    }
    if args.log_rounds:
        results["logging"] = logging_cost(
            corpus,
            args.log_clients,
            Loads([args.log_clients], args.seconds, args.warmup),
            args.log_rounds,
        )
    snippet = tune_snippet(best, args.loads)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "recommended.properties").write_text(snippet)
    plot_tune(runs, best, args.out)
    print(snippet)
    if "logging" in results:
        print(json.dumps(results["logging"]["mean"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
