"""Shared pieces of the benchmark and the tuner: the corpus, a closed-loop HTTP load, and the
handler's per-batch log lines.

The corpus is deterministic: review sentences from ``scripts/data/reviews.tsv`` stitched into
texts whose word counts follow a short-skewed (log-normal) distribution clipped to 5..200 words.
"""

from __future__ import annotations

import asyncio
import csv
import math
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

DATA_FILE = Path(__file__).resolve().parent / "data" / "reviews.tsv"
BATCH_LINE = re.compile(
    r"batch_size=(\d+) valid=(\d+) rejected=(\d+) sub_batches=\[([^\]]*)\] "
    r"real_tokens=(\d+) padded_tokens=(\d+)"
)


def make_corpus(
    size: int = 2000, seed: int = 7, min_words: int = 5, max_words: int = 200
) -> list[str]:
    with DATA_FILE.open(encoding="utf-8", newline="") as handle:
        reviews = [
            row["text"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        ]
    sentences = [s for review in reviews for s in re.split(r"(?<=[.!?])\s+", review) if s.strip()]
    rng = random.Random(seed)
    corpus = []
    for _ in range(size):
        target = min(max_words, max(min_words, round(rng.lognormvariate(math.log(25), 0.8))))
        words: list[str] = []
        while len(words) < target:
            words += rng.choice(sentences).split()
        corpus.append(" ".join(words[:target]))
    return corpus


def corpus_stats(corpus: list[str]) -> dict[str, float]:
    counts = sorted(len(text.split()) for text in corpus)
    return {
        "texts": len(corpus),
        "words_p50": counts[len(counts) // 2],
        "words_p90": counts[int(len(counts) * 0.9)],
        "words_max": counts[-1],
        "words_min": counts[0],
    }


@dataclass
class LoadResult:
    concurrency: int
    seconds: float
    requests: int = 0
    errors: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    rps: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


async def _closed_loop(
    url: str,
    headers: dict[str, str],
    texts: list[str],
    concurrency: int,
    seconds: float,
    progress: Callable[[int, float], None] | None,
) -> LoadResult:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    next_text = 0
    started = time.monotonic()
    deadline = started + seconds
    timeout = aiohttp.ClientTimeout(total=120)

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal next_text
        while time.monotonic() < deadline:
            text = texts[next_text % len(texts)]
            next_text += 1
            sent = time.perf_counter()
            try:
                async with session.post(url, json={"text": text}, headers=headers) as response:
                    await response.read()
                    status = str(response.status)
            except (TimeoutError, aiohttp.ClientError) as error:
                status = type(error).__name__
            if status == "200":
                latencies.append((time.perf_counter() - sent) * 1000)
            statuses[status] = statuses.get(status, 0) + 1

    async def report() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(1)
            if progress:
                progress(sum(statuses.values()), time.monotonic() - started)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(report(), *(user(session) for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    total = sum(statuses.values())
    return LoadResult(
        concurrency=concurrency,
        seconds=round(elapsed, 2),
        requests=total,
        errors=total - statuses.get("200", 0),
        statuses=statuses,
        rps=round(statuses.get("200", 0) / elapsed, 2),
        p50_ms=round(percentile(latencies, 50), 1),
        p90_ms=round(percentile(latencies, 90), 1),
        p99_ms=round(percentile(latencies, 99), 1),
    )


def run_load(
    url: str,
    headers: dict[str, str],
    texts: list[str],
    concurrency: int,
    seconds: float,
    label: str = "",
) -> LoadResult:
    """Closed loop: ``concurrency`` clients each send the next text as soon as the last answered."""

    def progress(done: int, elapsed: float) -> None:
        print(
            f"\r  {label} c={concurrency}: {elapsed:4.0f}/{seconds:.0f} s, {done} requests, "
            f"{done / max(elapsed, 1e-9):6.1f} rps   ",
            end="",
            file=sys.stderr,
            flush=True,
        )

    result = asyncio.run(_closed_loop(url, headers, texts, concurrency, seconds, progress))
    print(file=sys.stderr)
    return result


def batch_lines(log_text: str) -> dict[str, Any]:
    """Batch sizes and padding efficiency from the handler's ``batch_size=...`` log lines."""
    sizes: list[int] = []
    sub_batches = real = padded = 0
    for match in BATCH_LINE.finditer(log_text):
        sizes.append(int(match.group(1)))
        sub_batches += len([part for part in match.group(4).split(",") if part.strip()])
        real += int(match.group(5))
        padded += int(match.group(6))
    histogram: dict[str, int] = {}
    for size in sizes:
        histogram[str(size)] = histogram.get(str(size), 0) + 1
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
