"""How much a start's batch-size choice and queue repeat (issue 54, docs/configuration.md "How
much the choice repeats"): the start's rate measurement (``measure.in_fresh_process("rates")``,
the very one a start runs) taken ``runs`` times in a row, each in a fresh process, the start's
rule applied to each (``rules.batch_size_for`` on each size's best round, ``rules.best_rates``)
and, beside it, to each size's median round, so that both statistics are compared on the same
measurements. Beside each run, the child's CPU seconds over its wall seconds: near ``threads``
when it ran unhindered, lower when it waited for a CPU, so a spread of rates with a steady
ratio is the machine's speed, not a share of the CPU.

With ``probe`` (2 CPUs or more), the measurement runs on CPU 0 and a fixed matrix product
repeats on CPU 1 in a process of its own for the same seconds: its rate is the machine's speed
in those seconds, and each run's chosen rate over it (scaled by the runs' mean probe rate) is
what the measurement would give on a machine of steady speed. The measurement pinned to one CPU
runs its tokenizer on one thread, where a start's may use both."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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


PROBE = """
import signal, sys, time, torch
torch.set_num_threads(1)
matrix, stop = torch.randn(256, 256), []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
products, started = 0, time.perf_counter()
while products == 0 or not stop:
    matrix @ matrix
    products += 1
print(products / (time.perf_counter() - started), flush=True)
"""
"""The machine's speed: products of a 256 x 256 matrix a second, one thread, until SIGTERM (at
least one product: a block that ends at once still gets a rate)."""


@contextmanager
def speed_probe(cpu: int) -> Iterator[list[float]]:
    """``PROBE`` on ``cpu`` while the block runs; its rate is appended to the list at the end."""
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    rate: list[float] = []
    try:
        assert probe.stdout is not None and probe.stdout.readline().strip() == "ready"
        yield rate
    finally:
        probe.terminate()
        out, _ = probe.communicate(timeout=60)
    rate.append(float(out.strip()))


@contextmanager
def on_cpu(cpu: int) -> Iterator[None]:
    """This process (and the children it starts) on ``cpu`` alone while the block runs."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def one_run(mar: Path, threads: int, probe: bool = False) -> dict[str, Any]:
    with ExitStack() as stack:
        speed = stack.enter_context(speed_probe(1)) if probe else []
        if probe:
            stack.enter_context(on_cpu(0))
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
        **({"probe_per_s": round(speed[0], 1)} if speed else {}),
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


def at_steady_speed(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's chosen rate over its probe's rate, scaled by the runs' mean probe rate: the
    rate a machine of steady speed would have given, and its spread."""
    mean_probe = statistics.fmean(run["probe_per_s"] for run in runs)
    rates = [round(run["rate"] / run["probe_per_s"] * mean_probe, 1) for run in runs]
    probes = [run["probe_per_s"] for run in runs]
    return {
        "rates": rates,
        "rate_spread": round(max(rates) / min(rates) - 1, 3),
        "probe_spread": round(max(probes) / min(probes) - 1, 3),
    }


def run(mar: Path, runs: int, threads: int, probe: bool = False) -> dict[str, Any]:
    measured = [one_run(mar, threads, probe) for _ in range(runs)]
    steady = {"at_steady_speed": at_steady_speed(measured)} if probe else {}
    return {
        "command": "python scripts/sizing_repeats.py --out FILE" + " --probe" * probe,
        "machine": describe(),
        "archive": str(mar),
        "threads": threads,
        "runs": measured,
        "summary": summary(measured),
        "summary_by_median": summary([run["by_median"] for run in measured]),
        **steady,
    }
