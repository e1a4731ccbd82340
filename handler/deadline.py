"""A request's time: when it stops being worth working on, from its headers in (the rules:
docs/deadlines.md), and where its time went inside the worker, as headers out, named as TEI
names them (the table: docs/api.md).

TorchServe 0.12 passes the worker no arrival time: ``Pace`` estimates how long a batch will take
from the worker's recent batches, and every time out starts when the handler received the
batch; only ``x-wait-time`` reaches back to the client's own start stamp."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handler.protocol import header_value
from handler.values import BatchStats

START_HEADER = "X-Request-Start"
TIMEOUT_HEADER = "X-Request-Timeout"
GRPC_TIMEOUT_HEADER = "grpc-timeout"
ENVOY_TIMEOUT_HEADER = "x-envoy-expected-rq-timeout-ms"

GRPC_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
GRPC_TIMEOUT = re.compile(r"(\d{1,8})([HMSmun])")
NUMBER = re.compile(r"\d{1,20}(\.\d{1,9})?")
# A unix time in seconds has 10 digits until 2286; in ms 13, in us 16.
MS_FROM = 1e11
US_FROM = 1e14


def start_time(headers: Mapping[str, Any]) -> float | None:
    """The request's start as a unix time in seconds, or None when absent or malformed."""
    raw = (header_value(headers, START_HEADER) or "").strip().removeprefix("t=")
    if not NUMBER.fullmatch(raw):
        return None
    value = float(raw)
    if value >= US_FROM:
        return value / 1e6
    if value >= MS_FROM:
        return value / 1e3
    return value


def client_wait(headers: Mapping[str, Any]) -> float | None:
    """How long, in seconds, the client says it waits; the first header that parses wins."""
    raw = (header_value(headers, TIMEOUT_HEADER) or "").strip()
    if NUMBER.fullmatch(raw):
        return float(raw)
    grpc = GRPC_TIMEOUT.fullmatch((header_value(headers, GRPC_TIMEOUT_HEADER) or "").strip())
    if grpc:
        return int(grpc.group(1)) * GRPC_UNITS[grpc.group(2)]
    envoy = (header_value(headers, ENVOY_TIMEOUT_HEADER) or "").strip()
    if envoy.isdigit() and len(envoy) <= 12:
        return int(envoy) / 1e3
    return None


def deadline(headers: Mapping[str, Any], now: float) -> float | None:
    """The request's start plus its client's stated wait (unix time); None without both."""
    start = start_time(headers)
    wait = None if start is None else client_wait(headers)
    return None if start is None or wait is None else min(start, now) + wait


PACE_WINDOW = 20
"""``Pace`` estimates from this many of the worker's latest batches."""
PACE_STALE_S = 1.0
"""A pace not timed for this long may be kept up by one slow batch: time one batch again."""


@dataclass
class Pace:
    """This worker's recent batches, as seconds of handling per row forwarded (a text, or each
    window of a long one): a batch of n rows is expected to end n x the slowest of the last
    ``PACE_WINDOW`` after it began (None until
    a batch with texts was timed). The slowest, not the mean: batch times vary on a shared
    machine, and on the mean 29 % of the texts worked on under a stated spike were answered
    after their deadline (docs/deadlines.md)."""

    seconds_per_text: float | None = None
    timed_at: float = float("-inf")
    """When a batch with texts was last timed (unix time)."""
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_WINDOW))

    def expected_s(self, texts: int) -> float:
        """How long a batch of ``texts`` rows (texts, or windows) is expected to take; 0 when unknown."""
        return 0.0 if self.seconds_per_text is None else texts * self.seconds_per_text

    def is_stale(self, now: float) -> bool:
        return now - self.timed_at >= PACE_STALE_S

    def record(self, texts: int, seconds: float, at: float | None = None) -> None:
        if texts < 1 or seconds < 0:
            return
        self.timed_at = time.time() if at is None else at
        self.recent.append(seconds / texts)
        self.seconds_per_text = max(self.recent)


COMPUTE_TIME = "x-compute-time"
TOKENIZATION_TIME = "x-tokenization-time"
QUEUE_TIME = "x-queue-time"
INFERENCE_TIME = "x-inference-time"
BATCH_SIZE = "x-batch-size"
WAIT_TIME = "x-wait-time"
TIMING_HEADERS = (COMPUTE_TIME, TOKENIZATION_TIME, QUEUE_TIME, INFERENCE_TIME, BATCH_SIZE)

Headers = tuple[tuple[str, str], ...]


def milliseconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def timing_headers(
    requests: int, text_owners: Sequence[int], stats: BatchStats, received: float
) -> list[Headers]:
    """One set of headers per request. ``text_owners[k]`` is the request index of the k-th
    text the classifier was given; ``received`` the handler's ``perf_counter`` at receipt."""
    forwarded: list[set[int]] = [set() for _ in range(requests)]
    if len(stats.sub_batch_of) == len(text_owners) and stats.forward_started:
        for owner, batches_of_text in zip(text_owners, stats.sub_batch_of, strict=True):
            forwarded[owner].update(batches_of_text)
    common = ((COMPUTE_TIME, milliseconds(stats.handler_ms)), (BATCH_SIZE, str(requests)))
    headers: list[Headers] = []
    for sub_batches in forwarded:
        if not sub_batches:
            headers.append(common)
            continue
        first_start = min(stats.forward_started[i] for i in sub_batches)
        queue_ms = (first_start - received) * 1000 - stats.tokenize_ms
        inference_ms = sum(stats.sub_batch_forward_ms[i] for i in sub_batches)
        headers.append(
            (
                *common,
                (TOKENIZATION_TIME, milliseconds(stats.tokenize_ms)),
                (QUEUE_TIME, milliseconds(queue_ms)),
                (INFERENCE_TIME, milliseconds(inference_ms)),
            )
        )
    return headers


def wait_header(start: float | None, began: float) -> Headers:
    """For a request that stated its start (``X-Request-Start``, unix time): from that start to
    the batch's start (``began``, unix time) by the worker's clock, the wait TorchServe 0.12
    does not tell the worker; 0 for a start in the worker's future."""
    return () if start is None else ((WAIT_TIME, milliseconds((began - start) * 1000)),)
