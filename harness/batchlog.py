"""The handler's per-batch log lines (``batch_size=... valid=... sub_batches=[...] ...``),
read over the window of a measurement: which batches formed and how much padding they carried."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

BATCH_LINE = re.compile(
    r"batch_size=(\d+) valid=(\d+) rejected=(\d+) sub_batches=\[([^\]]*)\] "
    r"real_tokens=(\d+) padded_tokens=(\d+)"
)


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
