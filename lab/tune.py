"""The tuner's experiments: the candidate batching configs measured side by side at every
load, and what TorchServe's logging costs (``scripts/tune.py`` runs them and writes the
report; ``lab.reports`` picks the recommendation)."""

from __future__ import annotations

import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from bert_serve_server.archive import package_variant
from bert_serve_server.config import models_entry

from lab.measure import Loads, endpoint, frontend_cost, interleaved, servers
from lab.reports import recommend_across_loads

CANDIDATE = re.compile(r"b(\d+)d(\d+)w(\d+)t(\d+)")


def default_candidates(cores: float) -> list[str]:
    """The default layout (one worker per core, one torch thread each) at batch sizes 1 to 32
    and two batch delays, then the same cores as half the workers x 2 threads and as one
    worker with them all, batching as the default does; on 2 cores: b1d0w2t1, b4d1w2t1,
    b8d1w2t1, b16d1w2t1, b16d2w2t1, b32d2w2t1, b16d1w1t2."""
    workers = max(1, math.floor(cores))
    names = [
        f"b{b}d{d}w{workers}t1" for b, d in ((1, 0), (4, 1), (8, 1), (16, 1), (16, 2), (32, 2))
    ]
    for layout in (f"w{max(1, workers // 2)}t2", f"w1t{workers}"):
        if workers > 1 and f"b16d1{layout}" not in names:
            names.append(f"b16d1{layout}")
    return names


def parse_candidate(name: str) -> dict[str, int]:
    """``b16d2w2t1``: batch size 16, maxBatchDelay 2 ms, 2 workers x 1 torch thread."""
    match = CANDIDATE.fullmatch(name)
    if not match:
        raise ValueError(f"{name!r} is not like b16d2w2t1")
    batch_size, delay_ms, workers, threads = map(int, match.groups())
    return {"batch_size": batch_size, "delay_ms": delay_ms, "workers": workers, "threads": threads}


def candidate_name(config: dict[str, int]) -> str:
    return f"b{config['batch_size']}d{config['delay_ms']}w{config['workers']}t{config['threads']}"


def store_name(config: dict[str, int]) -> str:
    return f"threads{config['threads']}"


def sweep(configs: list[dict[str, int]], corpus: list[str], loads: Loads) -> list[dict[str, Any]]:
    """Every config on its own server (from a store whose .mar has its threads), all running
    at once and measured in turn at each load (``interleaved``)."""
    with tempfile.TemporaryDirectory(prefix="tune-stores-") as stores:
        for config in {store_name(config): config for config in configs}.values():
            package_variant(
                Path(stores) / store_name(config),
                handler_changes={"torch_threads": config["threads"]},
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


def run(
    candidates: list[dict[str, int]],
    corpus: list[str],
    loads: Loads,
    log_clients: int,
    log_rounds: int,
) -> dict[str, Any]:
    """The sweep and its recommendation, then (unless ``log_rounds`` is 0) the logging cost
    at ``log_clients`` clients."""
    runs = sweep(candidates, corpus, loads)
    results: dict[str, Any] = {
        "loads": list(loads.levels),
        "seconds_per_load": loads.seconds,
        "runs": runs,
        "recommended": recommend_across_loads(runs),
    }
    if log_rounds:
        log_loads = Loads([log_clients], loads.seconds, loads.warmup)
        results["logging"] = logging_cost(corpus, log_clients, log_loads, log_rounds)
    return results
