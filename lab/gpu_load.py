"""The GPU report's load: ``lab.load``'s closed loop spread over several processes (one asyncio
process tops out at a few thousand requests/s, below what one GPU serves), with the GPU's and
the host's busy share sampled while it runs.

A level's clients are split as evenly as possible over ``processes`` load processes, kept alive
across levels (a spawn costs a second). Each runs its share for the same seconds and returns the
latencies of its 200s, its statuses and its CPU seconds; the level's summary pools them.
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


def pooled(parts: Sequence[Mapping[str, Any]], clients: int) -> dict[str, Any]:
    """One level's summary from its load processes' parts: requests/s over the longest part,
    latency percentiles of every 200, every status counted."""
    ms = [value for part in parts for value in part["ms"]]
    counts: Counter[str] = Counter()
    for part in parts:
        counts.update(part["statuses"])
    elapsed = max([part["elapsed"] for part in parts] + [1e-9])
    requests = sum(counts.values())
    return {
        "concurrency": clients,
        "load_processes": len(parts),
        "seconds": round(elapsed, 2),
        "requests": requests,
        "errors": requests - len(ms),
        "statuses": dict(sorted(counts.items())),
        "rps": round(len(ms) / elapsed, 1),
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "load_generator_cores": round(sum(part["cpu_s"] for part in parts) / elapsed, 2),
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
        """Fills ``gpu_busy_pct`` (the mean over samples and GPUs; None without a GPU) and
        ``host_cpu_busy_pct`` (every core of the host) when the block ends."""
        found: dict[str, Any] = {}
        samples: list[float] = []
        stop = threading.Event()

        def sampling() -> None:
            while not stop.wait(SAMPLE_S):
                samples.extend(self.sample() or [])

        thread = threading.Thread(target=sampling, daemon=True)
        psutil.cpu_percent()
        thread.start()
        try:
            yield found
        finally:
            stop.set()
            thread.join()
            found["host_cpu_busy_pct"] = psutil.cpu_percent()
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
    ) -> dict[str, Any]:
        """``clients`` clients for ``seconds``; with the cores the processes of ``pids`` (the
        frontend, each worker) used meanwhile, summed as ``frontend`` and ``workers``."""
        before = {n: cpu for n, pid in (pids or {}).items() if (cpu := _cpu(pid)) is not None}
        started = time.monotonic()
        with self.busy.during() as busy:
            jobs = [
                self.pool.submit(run_share, url, headers, list(texts), share, seconds)
                for share in shares(clients, self.processes)
            ]
            parts = [job.result() for job in jobs]
        wall = max(time.monotonic() - started, 1e-9)
        cores: dict[str, float] = {}
        for name, cpu in before.items():
            now = _cpu((pids or {})[name])
            if now is not None:
                group = "frontend" if name == "frontend" else "workers"
                cores[group] = round(cores.get(group, 0.0) + (now - cpu) / wall, 2)
        return pooled(parts, clients) | busy | {"cores": cores}


def _cpu(pid: int) -> float | None:
    with suppress(psutil.Error):
        return process_cpu_s(pid)
    return None
