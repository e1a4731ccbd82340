"""The handler's per-batch log lines (``batch_size=... valid=... sub_batches=[...] ...``),
read over the window of a measurement: which batches formed, how much padding they carried,
and how long their forward passes took, and what they expired."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from lab.load import ClosedLoop, cores_used, percentile

BATCH_LINE = re.compile(
    r"batch_size=(\d+) valid=(\d+) rejected=(\d+) sub_batches=\[([^\]]*)\] "
    r"real_tokens=(\d+) padded_tokens=(\d+)"
)
TIMES_LINE = re.compile(
    r"sub_batches=\[([^\]]*)\] .*? forward_ms=([\d.]+) threads=\d+ expired=(\d+)"
)
LOG_LAG_S = 10.0
"""How long ``logged_batches`` waits for a worker's lines: TorchServe's frontend copies them
into the model log after the answers have gone out, milliseconds later on a quiet machine."""
SMALL_BATCH_TEXTS = 4
"""Batches of at most this many texts worked on, against full ones (``FULL_BATCH_TEXTS``):
their forward time per text shows how much of a batch's time is fixed."""
FULL_BATCH_TEXTS = 12


def batch_summary(log_text: str) -> dict[str, Any]:
    """Batch sizes and padding efficiency from the handler's ``batch_size=...`` log lines."""
    sizes: list[int] = []
    sub_batches = real = padded = 0
    for match in BATCH_LINE.finditer(log_text):
        sizes.append(int(match.group(1)))
        sub_batches += len([part for part in match.group(4).split(",") if part.strip()])
        real += int(match.group(5))
        padded += int(match.group(6))
    histogram = Counter(str(size) for size in sizes)
    return {
        "batches": len(sizes),
        "mean_batch_size": round(sum(sizes) / len(sizes), 2) if sizes else 0.0,
        "max_batch_size": max(sizes, default=0),
        "batch_size_histogram": dict(sorted(histogram.items(), key=lambda item: int(item[0]))),
        "sub_batches_per_batch": round(sub_batches / len(sizes), 2) if sizes else 0.0,
        "padding_efficiency": round(real / padded, 3) if padded else None,
    }


def batch_times(log_text: str) -> dict[str, Any]:
    """From the handler's batch lines: how many, the requests it expired, and the forward time
    of the batches that forwarded texts. Under a spike the load generator shares the CPU, so the
    forward time shows what is left for the model. The forward time per text, of small and
    of full batches, shows whether a batch's time is mostly fixed or mostly per text (what
    ``handler.deadline.Pace`` assumes)."""
    forwards: list[float] = []
    per_text: dict[str, list[float]] = {"small": [], "full": []}
    batches = expired = texts = 0
    for sub_batches, forward_ms, expired_count in TIMES_LINE.findall(log_text):
        batches += 1
        expired += int(expired_count)
        worked = sum(int(part) for part in sub_batches.split(",") if part.strip())
        texts += worked
        if float(forward_ms) > 0 and worked:
            forwards.append(float(forward_ms))
            if worked <= SMALL_BATCH_TEXTS:
                per_text["small"].append(float(forward_ms) / worked)
            elif worked >= FULL_BATCH_TEXTS:
                per_text["full"].append(float(forward_ms) / worked)
    return {
        "batches": batches,
        "expired": expired,
        "texts_forwarded": texts,
        "forward_ms_p50": round(percentile(forwards, 50), 1),
        "forward_ms_p90": round(percentile(forwards, 90), 1),
        "forward_ms_per_text": {
            kind: {"batches": len(values), "p50": round(percentile(values, 50), 1)}
            for kind, values in per_text.items()
        },
    }


class LogWindow:
    """Reads what a log file gained between ``__enter__`` and ``read()``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def __enter__(self) -> LogWindow:
        self.offset = self.path.stat().st_size if self.path.exists() else 0
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self) -> str:
        with self.path.open(encoding="utf-8", errors="replace") as handle:
            handle.seek(self.offset)
            return handle.read()


def observed(
    load: ClosedLoop, processes: Mapping[str, int] | None = None, logs: Sequence[Path] = ()
) -> tuple[dict[str, float], list[str]]:
    """Run ``load``: the cores each of ``processes`` used meanwhile (``cores_used``) and what
    each of ``logs`` gained, read half a second after it (the handler logs a batch just after
    answering it)."""
    with ExitStack() as stack:
        windows = [stack.enter_context(LogWindow(path)) for path in logs]
        with cores_used(processes or {}) as cores:
            load.run()
        time.sleep(0.5 if windows else 0)
        return cores, [window.read() for window in windows]


def logged_batches(
    path: Path, offset: int, items: int, within_s: float = LOG_LAG_S
) -> tuple[list[int], int]:
    """The sizes of the batches logged after ``offset`` (``batch_size=N``) once they hold
    ``items`` requests, or what is there after ``within_s``; and the offset after the last
    whole line read, where the next window starts. Read at once after the answers, the last
    lines may not be written yet: a count falls short, and a window started then takes in
    lines of the requests before it."""
    deadline = time.monotonic() + within_s
    while True:
        with path.open("rb") as log:
            log.seek(offset)
            gained = log.read()
        whole = gained[: gained.rfind(b"\n") + 1]
        sizes = [int(size) for size in re.findall(rb"batch_size=(\d+)", whole)]
        if sum(sizes) >= items or time.monotonic() > deadline:
            return sizes, offset + len(whole)
        time.sleep(0.1)
