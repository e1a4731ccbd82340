"""The GPU report's load: ``lab.load``'s closed loop spread over several processes (one asyncio
process tops out at a few thousand requests/s, below what one GPU serves), with the GPU's busy
share, each host core's (``/proc/stat``) and the CPU seconds of the load and of the server.

A level's clients are split as evenly as possible over ``processes`` load processes, kept alive
across levels (a spawn costs a second). Each runs its share for the same seconds and returns the
latencies of its 200s, its statuses and its CPU seconds; a level is measured ``repeats`` times
back to back, and its summary gives the median requests/s and their spread, the rest pooled.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing import get_context
from statistics import median
from typing import Any

import psutil

from lab.load import ClosedLoop, json_job, percentile, process_cpu_s, statuses

SAMPLE_S = 0.2
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")


def shares(clients: int, processes: int) -> list[int]:
    """``clients`` split over at most ``processes`` load processes, none empty."""
    used = max(1, min(clients, processes))
    return [clients // used + (1 if n < clients % used else 0) for n in range(used)]


def run_share(
    url: str, headers: dict[str, str], texts: list[str], clients: int, seconds: float
) -> dict[str, Any]:
    """One load process's share of a level (runs in a pool process)."""
    cpu_started = time.process_time()
    loop = ClosedLoop(
        url, headers, lambda n: json_job(texts[n % len(texts)]), clients, seconds
    ).run()
    return {
        "ms": [outcome.ms for outcome in loop.outcomes if outcome.status == "200"],
        "statuses": statuses(loop.outcomes),
        "elapsed": loop.elapsed,
        "cpu_s": time.process_time() - cpu_started,
    }


def pooled(runs: Sequence[Sequence[Mapping[str, Any]]], clients: int) -> dict[str, Any]:
    """One level's summary from its repeats' parts (one per load process): the median of the
    repeats' requests/s (each over its longest part) and their spread ((max - min) / median),
    latency percentiles of every 200, every status counted, the load processes' CPU seconds."""
    parts = [part for run in runs for part in run]
    ms = [value for part in parts for value in part["ms"]]
    counts: Counter[str] = Counter()
    for part in parts:
        counts.update(part["statuses"])
    elapsed = [max([part["elapsed"] for part in run] + [1e-9]) for run in runs]
    served = [sum(len(part["ms"]) for part in run) for run in runs]
    rates = [round(n / s, 1) for n, s in zip(served, elapsed, strict=True)]
    requests, rps = sum(counts.values()), median(rates)
    return {
        "concurrency": clients,
        "load_processes": len(runs[0]),
        "seconds": round(sum(elapsed), 2),
        "requests": requests,
        "errors": requests - len(ms),
        "statuses": dict(sorted(counts.items())),
        "rps": rps,
        "rps_runs": rates,
        "rps_spread": round((max(rates) - min(rates)) / rps, 3) if rps else None,
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "load_generator_cpu_s": round(sum(part["cpu_s"] for part in parts), 2),
    }


class GpuBusy:
    """The GPUs' busy share, sampled every ``SAMPLE_S`` while a block runs: NVML through
    pynvml where it imports, else ``nvidia-smi``, else none (a machine without a GPU)."""

    def __init__(self) -> None:
        self.source, self.handles = "none", []
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.nvml, self.source = pynvml, "nvml"
        except Exception:  # no pynvml, or no driver behind it
            if shutil.which(NVIDIA_SMI[0]) and self._smi() is not None:
                self.source = "nvidia-smi"

    def _smi(self) -> list[float] | None:
        with suppress(OSError, subprocess.SubprocessError, ValueError):
            done = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=5)
            return [float(line) for line in done.stdout.split()]
        return None

    def sample(self) -> list[float] | None:
        if self.source == "nvml":
            return [float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.handles]
        if self.source == "nvidia-smi":
            return self._smi()
        return None

    @contextmanager
    def during(self) -> Iterator[dict[str, Any]]:
        """Fills ``gpu_busy_pct`` (the mean over samples and GPUs; None without a GPU),
        ``host_cpu_busy_pct`` and ``per_core_busy`` (each core's share) when the block ends."""
        found: dict[str, Any] = {}
        samples: list[float] = []
        stop = threading.Event()

        def sampling() -> None:
            while not stop.wait(SAMPLE_S):
                samples.extend(self.sample() or [])

        thread = threading.Thread(target=sampling, daemon=True)
        psutil.cpu_percent(percpu=True)
        thread.start()
        try:
            yield found
        finally:
            stop.set()
            thread.join()
            cores = psutil.cpu_percent(percpu=True)  # /proc/stat's deltas since the call above
            found["host_cpu_busy_pct"] = round(sum(cores) / len(cores), 1)
            found["per_core_busy"] = [round(share / 100, 2) for share in cores]
            found["gpu_busy_pct"] = round(sum(samples) / len(samples), 1) if samples else None
            found["gpu_busy_source"] = self.source


@dataclass
class Loader:
    """The load processes, alive while the report runs; ``level`` runs one level on a URL."""

    processes: int
    busy: GpuBusy = field(default_factory=GpuBusy)
    pool: ProcessPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.pool = ProcessPoolExecutor(self.processes, mp_context=get_context("spawn"))
        list(self.pool.map(time.sleep, [0.0] * self.processes))  # the processes start now

    def close(self) -> None:
        self.pool.shutdown()

    def level(
        self,
        url: str,
        headers: dict[str, str],
        texts: Sequence[str],
        clients: int,
        seconds: float,
        pids: Mapping[str, int] | None = None,
        repeats: int = 1,
    ) -> dict[str, Any]:
        """``clients`` clients for ``seconds``, ``repeats`` times; with the CPU seconds and
        cores the processes of ``pids`` (the frontend, each worker) used meanwhile, the cores
        summed as ``frontend`` and ``workers``."""
        pids = pids or {}
        before = {n: cpu for n, pid in pids.items() if (cpu := _cpu(pid)) is not None}
        started = time.monotonic()
        with self.busy.during() as busy:
            runs = []
            for _ in range(repeats):
                jobs = [
                    self.pool.submit(run_share, url, headers, list(texts), n, seconds)
                    for n in shares(clients, self.processes)
                ]
                runs.append([job.result() for job in jobs])
        wall = max(time.monotonic() - started, 1e-9)
        used = {n: now - cpu for n, cpu in before.items() if (now := _cpu(pids[n])) is not None}
        cores: dict[str, float] = {}
        for name, cpu_s in used.items():
            group = "frontend" if name == "frontend" else "workers"
            cores[group] = round(cores.get(group, 0.0) + cpu_s / wall, 2)
        server = {"server_cpu_s": round(sum(used.values()), 2), "cores": cores}
        return pooled(runs, clients) | busy | server


def _cpu(pid: int) -> float | None:
    with suppress(psutil.Error):
        return process_cpu_s(pid)
    return None
