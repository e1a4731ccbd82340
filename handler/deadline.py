"""When a request stops being worth working on, from its headers (the rules: docs/deadlines.md):
TorchServe 0.12 passes the worker no arrival time. ``Pace`` estimates how long a batch will
take from the worker's recent batches."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from handler.protocol import header_value

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
