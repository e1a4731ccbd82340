"""The benchmark's LitServe peer (``scripts/litserve_peer.py``) as a process of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from bert_serve.harness.config import ROOT, free_port

PEER_SCRIPT = ROOT / "scripts" / "litserve_peer.py"
PEER_CONFIG = {"max_batch_size": 1, "workers_per_device": 1}


def wait_healthy(process: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the LitServe peer exited with {process.returncode}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
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
def litserve_peer(model_dir: Path, ready_timeout: float = 120) -> Iterator[str]:
    """A healthy LitServe peer on a free 127.0.0.1 port; yields its predict URL."""
    port = free_port()
    command = [sys.executable, str(PEER_SCRIPT), "--model-dir", str(model_dir), "--port", str(port)]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", ready_timeout)
        yield f"http://127.0.0.1:{port}/predict"
    finally:
        end(process)
