"""The benchmarks' LitServe peer (``lab.litserve_peer``) as a process of its own: out of the box
(``OUT_OF_THE_BOX``: one worker, torch's threads, no batching) or configured like a server
(``configured_like``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests
from bert_serve_server.config import ROOT, free_port

PEERS = ("litserve", "litserve_tuned")
OUT_OF_THE_BOX: dict[str, float] = {
    "workers": 1,
    "torch_threads": 0,
    "max_batch_size": 1,
    "batch_timeout_ms": 0,
}


def configured_like(in_force: dict[str, Any]) -> dict[str, float]:
    """LitServe configured like a server's settings in force (``make status``): its workers,
    torch threads per worker, batch size and batch delay."""
    (entry,) = [entry for versions in in_force["models"].values() for entry in versions.values()]
    return {
        "workers": entry["minWorkers"],
        "torch_threads": in_force["torch_threads"],
        "max_batch_size": entry["batchSize"],
        "batch_timeout_ms": entry["maxBatchDelay"],
    }


@dataclass(frozen=True)
class Peer:
    url: str
    """Its predict URL."""
    process_group: int
    """The peer's processes (API server and workers), to pause between turns: idle, they poll
    their queues and took a third of a core from the server being measured."""

    def pids(self) -> list[int]:
        """The peer's process and every process under it (API servers, inference workers)."""
        try:
            root = psutil.Process(self.process_group)
            return [root.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.Error:
            return []


def wait_healthy(process: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the LitServe peer exited with {process.returncode}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the LitServe peer did not become healthy within {timeout:.0f} s")
        time.sleep(0.5)


def end(process: subprocess.Popen[bytes]) -> None:
    """Stop the peer's process group (it started its own session), forcefully if it lingers."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:  # the whole group has exited already
        process.wait(timeout=30)
        return
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@contextmanager
def litserve_peer(
    model_dir: Path, config: Mapping[str, float | str], ready_timeout: float = 120
) -> Iterator[Peer]:
    """A healthy LitServe peer of ``config`` (``OUT_OF_THE_BOX`` or ``configured_like``) on a
    free 127.0.0.1 port."""
    port = free_port()
    peer = ["-m", "lab.litserve_peer", "--model-dir", str(model_dir), "--port", str(port)]
    command = [sys.executable, *peer]
    for key, value in config.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    quiet = subprocess.DEVNULL
    process = subprocess.Popen(
        command, cwd=ROOT, start_new_session=True, stdout=quiet, stderr=quiet
    )
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", ready_timeout)
        yield Peer(f"http://127.0.0.1:{port}/predict", process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGCONT)
        end(process)
