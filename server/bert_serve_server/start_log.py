"""A start's logs, read for what a person needs when it fails: which model's worker died
loading and the first error line of its traceback (``worker_load_errors``), and the frontend's
last lines (``log_tail``). Lines of TorchServe's own log files only, as they are written."""

from __future__ import annotations

import re
from pathlib import Path

LOG_TAIL_LINES = 8


WORKER_DIED = "Backend worker process died."
ERROR_LINE = re.compile(r" - (\w[\w.]*(?:Error|Exception|Refused): .*)$")


def worker_load_error(log_text: str) -> str | None:
    """Once a worker died in ``log_text`` (the model log of a start), the first error line of
    its traceback (the handler's own reason, not the "500 - Unknown exception" TorchServe
    re-raises), or a plain "a worker died"; None while no worker died."""
    lines = log_text.splitlines()
    if not any(line.endswith(WORKER_DIED) for line in lines):
        return None
    errors = [match.group(1) for match in map(ERROR_LINE.search, lines) if match]
    return errors[0] if errors else "a worker died while loading the model"


WORKER_TAG = re.compile(r" W-\d+-(\S+)-std(?:out|err) ")
"""The worker's tag in a model log line: ``W-<port>-<name>_<version>-stdout``."""


def worker_load_errors(log_text: str) -> dict[str, str]:
    """``worker_load_error`` for each worker tag's lines (``<name>_<version>``)."""
    by_tag: dict[str, list[str]] = {}
    for line in log_text.splitlines():
        match = WORKER_TAG.search(line)
        by_tag.setdefault(match.group(1) if match else "", []).append(line)
    return {
        tag: error
        for tag, lines in by_tag.items()
        if (error := worker_load_error("\n".join(lines))) is not None
    }


def failed_models(served: dict[str, list[str]], errors: dict[str, str]) -> dict[str, str]:
    """The worker tags of ``errors`` as the ``NAME:VERSION`` they serve (``served``: each
    name's versions)."""
    keys = {
        f"{name}_{version}": f"{name}:{version}"
        for name, versions in served.items()
        for version in versions
    }
    return {keys.get(tag, tag): error for tag, error in errors.items()}


def log_tail(state_dir: Path) -> str:
    """The frontend's last console and log lines in ``state_dir``, for an error message that
    outlives a temporary state folder."""
    lines: list[str] = []
    for name in ("console.log", "ts_log.log"):
        path = state_dir / "logs" / name
        if path.is_file():
            lines += path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return " | ".join(line.strip() for line in lines if line.strip()) or "(no log lines)"


def read_from(path: Path, offset: int) -> str:
    with path.open("rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")
