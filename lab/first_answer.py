"""Time ``make serve`` on a fresh clone, as a new user runs it: from the command to the first
successful answer, split into its steps (``scripts/first_answer.py``).

The clone gets its own empty pip and uv caches (what a new machine has; pip's configured
sources, such as a local wheel folder, stay). Each step's end is read from what it leaves:
the venv's install stamp, the model's ``training_report.json``, the ``.mar``, then ``make
serve`` returning with the workers READY; after that a review is POSTed until it is answered
200. The server is always stopped with ``make stop``. Standard library only: it runs before
the clone has a venv.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# (step, file whose modification time ends it, relative to the clone)
STEPS = (
    ("install", ".venv/.installed"),
    ("model", "build/bert-sentiment/training_report.json"),
    ("package", "model_store/bert.mar"),
)
REVIEW = b"An absolute delight from start to finish."


def clone(source: Path, ref: str, into: Path) -> None:
    subprocess.run(["git", "clone", "--quiet", "--branch", ref, str(source), str(into)], check=True)


def cold_env(caches: Path) -> dict[str, str]:
    """The caller's environment with empty download caches."""
    env = dict(os.environ)
    for name in ("PIP_CACHE_DIR", "UV_CACHE_DIR"):
        env[name] = str(caches / name.lower())
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    return env


def ctl(checkout: Path, *args: str) -> str:
    command = [".venv/bin/python", "-m", "bert_serve_server", *args, "--state-dir", ".run"]
    return subprocess.run(command, cwd=checkout, capture_output=True, text=True).stdout.strip()


def first_answer(url: str, key: str, timeout_s: float) -> tuple[float, int]:
    """POST the review until it is answered 200: (monotonic time of the answer, tries)."""
    headers = {"Content-Type": "text/plain"} | ({"Authorization": f"Bearer {key}"} if key else {})
    deadline, tries = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        tries += 1
        try:
            request = urllib.request.Request(url, data=REVIEW, headers=headers)
            with urllib.request.urlopen(request, timeout=10) as response:
                if response.status == 200:
                    return time.monotonic(), tries
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no 200 from {url} within {timeout_s} s ({tries} tries)")


def measure(source: Path, ref: str, make_args: list[str], timeout_s: float = 900) -> dict[str, Any]:
    """Clone ``ref`` of ``source`` to a temporary folder, run ``make serve`` there cold and
    time it; the clone is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="first-answer-") as temp:
        checkout, caches = Path(temp) / "clone", Path(temp) / "caches"
        clone(source, ref, checkout)
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True
        ).stdout.strip()
        env = cold_env(caches)
        load_before = os.getloadavg()
        started, wall_started = time.monotonic(), time.time()
        try:
            serve = subprocess.run(
                ["make", "serve", *make_args], cwd=checkout, env=env, timeout=timeout_s
            )
            ready = time.monotonic()
            if serve.returncode != 0:
                raise RuntimeError(f"make serve exited {serve.returncode}")
            answered, tries = first_answer(
                ctl(checkout, "predict-url"), ctl(checkout, "key", "inference"), 60
            )
        finally:
            subprocess.run(["make", "stop"], cwd=checkout, env=env, capture_output=True)
        ends = [(step, (checkout / path).stat().st_mtime - wall_started) for step, path in STEPS]
        seconds, previous = {}, 0.0
        for step, end in ends:
            seconds[step], previous = round(end - previous, 1), end
        seconds["start"] = round(ready - started - previous, 1)
        seconds["first_request"] = round(answered - ready, 1)
        return {
            "commit": commit,
            "command": " ".join(["make", "serve", *make_args]),
            "seconds": seconds,
            "total_seconds": round(answered - started, 1),
            "tries": tries,
            "load_average_before": [round(load, 2) for load in load_before],
            "load_average_after": [round(load, 2) for load in os.getloadavg()],
            "cores": os.cpu_count(),
        }
