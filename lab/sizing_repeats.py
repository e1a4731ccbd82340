"""How much a start's batch-size choice and queue repeat (issue 54, docs/configuration.md "How
much the choice repeats"): the start's rate measurement (``measure.in_fresh_process("rates")``,
the very one a start runs) taken ``runs`` times in a row, each in a fresh process, the start's
rule applied to each (``rules.batch_size_for`` on each size's best round, ``rules.best_rates``)
and, beside it, to each size's median round, so that both statistics are compared on the same
measurements. Beside each run, the child's CPU seconds over its wall seconds: near ``threads``
when it ran unhindered, lower when it waited for a CPU, so a spread of rates with a steady
ratio is the machine's speed, not a share of the CPU."""

from __future__ import annotations

import resource
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bert_serve_server import measure
from bert_serve_server.rules import BATCH_SIZES, batch_size_for, best_rates

from lab.machine import describe


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def median_rates(samples: dict[int, list[float]]) -> dict[int, float]:
    return {size: round(statistics.median(rates), 1) for size, rates in samples.items()}


def chosen(rates: dict[int, float]) -> dict[str, Any]:
    batch_size, _ = batch_size_for(rates)
    return {"rates": rates, "batch_size": batch_size, "rate": rates[batch_size]}


def one_run(mar: Path, threads: int) -> dict[str, Any]:
    wall, cpu = time.monotonic(), children_cpu_s()
    raw = measure.in_fresh_process("rates", mar, [list(BATCH_SIZES), threads, 0])
    wall, cpu = time.monotonic() - wall, children_cpu_s() - cpu
    samples = {int(size): rounds for size, rounds in raw.items()}
    return {
        **chosen(best_rates(samples)),
        "by_median": chosen(median_rates(samples)),
        "samples": samples,
        "seconds": round(wall, 1),
        "cpu_per_wall": round(cpu / wall, 3),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The choices' counts, the most common one's share, and the spread of the chosen rate (the
    queue is a minute of it, so it spreads as much)."""
    counts = Counter(run["batch_size"] for run in runs)
    rates = [run["rate"] for run in runs]
    return {
        "batch_sizes": dict(counts),
        "most_common": counts.most_common(1)[0][1],
        "rate_min": min(rates),
        "rate_max": max(rates),
        "rate_spread": round(max(rates) / min(rates) - 1, 3),
    }


def run(mar: Path, runs: int, threads: int) -> dict[str, Any]:
    measured = [one_run(mar, threads) for _ in range(runs)]
    return {
        "command": "python scripts/sizing_repeats.py --out FILE",
        "machine": describe(),
        "archive": str(mar),
        "threads": threads,
        "runs": measured,
        "summary": summary(measured),
        "summary_by_median": summary([run["by_median"] for run in measured]),
    }
