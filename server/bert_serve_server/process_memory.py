"""Processes' memory as the server's tools report it, always in MB (10**6 bytes): the frontend's
resident set and each worker's resident and unique sets (``Server.memory``)."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

MB = 10**6


@dataclass(frozen=True)
class WorkerMemory:
    pid: int
    rss_mb: float | None
    uss_mb: float | None
    """What this worker alone holds (unique set size)."""


@dataclass(frozen=True)
class Memory:
    """Resident memory in MB (10**6 bytes); None for a process that is gone."""

    frontend_rss_mb: float | None
    workers: dict[str, WorkerMemory]
    """By worker id (stable across a worker's restarts, unlike its pid)."""

    @property
    def workers_rss_mb(self) -> float:
        return round(sum(worker.rss_mb or 0.0 for worker in self.workers.values()), 1)


def rss_mb(pid: int | None) -> float | None:
    """A process's resident memory in MB; None if there is no such process."""
    try:
        return round(psutil.Process(pid).memory_info().rss / MB, 1) if pid else None
    except psutil.Error:
        return None


def worker_memory(pid: int) -> WorkerMemory:
    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return WorkerMemory(pid, None, None)
    return WorkerMemory(pid, round(info.rss / MB, 1), round(info.uss / MB, 1))
