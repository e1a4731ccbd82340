"""How long the frontend's queue is holding requests now, for requests that carry no start stamp.

TorchServe 0.12 tells the worker nothing of a request's arrival (``handler.deadline``), but its
frontend records every answered request's time in the queue as the ``QueueTime`` gauge (ms,
the latest answer's value) on its metrics endpoint. The queue is first in, first out, so a
batch taken from a backlog has waited about as long as the batch answered just before it:
that gauge is the estimate. It is read only for a full batch (TorchServe filled it at once, so
a backlog stood behind it); a partial batch emptied the queue and had no backlog to wait in,
and with ``batchSize`` 1 fullness says nothing. A batch whose requests all carry a start
stamp needs no estimate and reads nothing.

The endpoint is TorchServe's metrics address, ``BERT_SERVE_FRONTEND_METRICS`` when set (the
server tooling sets it from ``metrics_address``), else TorchServe's default. Where it cannot
be read (another port, ``metrics_mode=log``, the gauge left out of the metrics config) there
is no estimate, and unstamped requests have no deadline, as before.

The same read tells whether the frontend is refusing for a full queue: its ``Requests5XX``
counter counts every 5xx it wrote, and the handler's ``ItemsRejected{Reason="deadline_exceeded"}``
the 504s the workers wrote among them; the rest are the frontend's own 503s (and the rare 500 or
507 of a failed or dead worker). While those come faster than ``OVERLOAD_REFUSALS_PER_S``, the
server is **overloaded**: its queue is full, so requests are refused anyway, and one that
states no wait is held to the server's budget end to end, not only in the queue
(``handler.pipeline.expire``). Patient load within the queue's size never fills it, so it
never sees this.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handler.deadline import start_time

logger = logging.getLogger(__name__)

METRICS_URL_ENV = "BERT_SERVE_FRONTEND_METRICS"
DEFAULT_METRICS_URL = "http://127.0.0.1:8082/metrics"
GAUGE = "QueueTime"
ERRORS = "Requests5XX"
REJECTED = "ItemsRejected"
SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE)
"""One Prometheus sample line: name, labels, value."""
OVERLOAD_REFUSALS_PER_S = 50.0
"""Frontend refusals a second that mean its queue is full: a spike on this project's 2-core
machine brings 700 to 1,600 (docs/deadlines.md); patient load, none."""
OVERLOAD_MIN_REFUSALS = 32
"""...and at least this many between two readings: the workers' 504 count reaches the frontend
through their log a little after the 504s themselves, up to a batch or two per worker."""
OVERLOAD_WINDOW_S = 0.5
"""Readings at least this far apart are compared."""
OVERLOAD_HOLD_S = 2.0
"""How long one comparison that found refusals keeps the server overloaded."""
FETCH_TIMEOUT_S = 0.2
FRESH_FOR_S = 0.005
"""A reading this recent is reused: a run of small full batches reads once."""
RETRY_AFTER_FAILURE_S = 30.0

Fetch = Callable[[str], str]


def metrics_url() -> str:
    """The address of the gauge and the two counters: only those are asked for (a short answer)."""
    base = os.environ.get(METRICS_URL_ENV) or DEFAULT_METRICS_URL
    return f"{base}?name[]={GAUGE}&name[]={ERRORS}&name[]={REJECTED}"


def queue_time_s(metrics_text: str) -> float | None:
    """The gauge's value in seconds from a Prometheus text answer; None when absent."""
    values = [float(value) for name, _, value in SAMPLE.findall(metrics_text) if name == GAUGE]
    return max(values) / 1e3 if values else None


def frontend_refusals(metrics_text: str) -> float:
    """The 5xx answers the frontend wrote that were not the workers' 504s (its 503s for a full
    queue, mostly), since it started. A counter the frontend has not incremented yet is not in
    its answer: it counts as 0, so the first refusals are measured against that."""
    errors = ours = 0.0
    for name, labels, value in SAMPLE.findall(metrics_text):
        if name == ERRORS:
            errors += float(value)
        elif name == REJECTED and 'Reason="deadline_exceeded"' in labels:
            ours += float(value)
    return errors - ours


class KeptConnection:
    """GET over one kept-alive connection (a new TCP connection per batch would cost more
    than the read); a failed read drops it, and the next read connects again."""

    def __init__(self) -> None:
        self.connection: http.client.HTTPConnection | None = None

    def __call__(self, url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        if self.connection is None:
            self.connection = http.client.HTTPConnection(
                parts.hostname or "127.0.0.1", parts.port or 80, timeout=FETCH_TIMEOUT_S
            )
        try:
            self.connection.request("GET", f"{parts.path}?{parts.query}")
            response = self.connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise OSError(f"HTTP {response.status}")
        except Exception:
            self.connection.close()
            self.connection = None
            raise
        return body.decode("utf-8", "replace")


@dataclass
class QueueAge:
    """The frontend queue's recent wait, read at most every ``FRESH_FOR_S``; after a failed
    read, none is tried for ``RETRY_AFTER_FAILURE_S`` (an unreachable endpoint must not cost
    every batch a timeout)."""

    url: str = field(default_factory=metrics_url)
    fetch: Fetch = field(default_factory=KeptConnection)
    clock: Callable[[], float] = time.monotonic
    _value: float | None = None
    _read_at: float = float("-inf")
    _failed_at: float = float("-inf")
    _refusals_seen: tuple[float, float] | None = None
    """(when, how many) at the reading the next one is compared with."""
    _overloaded_until: float = float("-inf")

    def seconds(self) -> float | None:
        now = self.clock()
        if now - self._read_at < FRESH_FOR_S:
            return self._value
        if now - self._failed_at < RETRY_AFTER_FAILURE_S:
            return None
        try:
            text = self.fetch(self.url)
            self._value = queue_time_s(text)
        except Exception as error:  # an unreachable or odd endpoint only disables the estimate
            if self._failed_at == float("-inf"):
                logger.warning("frontend queue time unreadable at %s: %s", self.url, error)
            self._failed_at, self._value = now, None
            return None
        self._read_at = now
        self._compare_refusals(now, frontend_refusals(text))
        return self._value

    def _compare_refusals(self, now: float, refusals: float) -> None:
        seen = self._refusals_seen
        if seen is None or refusals < seen[1]:  # the first reading, or a restarted frontend
            self._refusals_seen = (now, refusals)
            return
        elapsed, more = now - seen[0], refusals - seen[1]
        if elapsed < OVERLOAD_WINDOW_S:
            return
        if more >= OVERLOAD_MIN_REFUSALS and more / elapsed >= OVERLOAD_REFUSALS_PER_S:
            self._overloaded_until = now + OVERLOAD_HOLD_S
        self._refusals_seen = (now, refusals)

    def overloaded(self) -> bool:
        """Whether a recent reading found the frontend refusing for a full queue."""
        return self.clock() < self._overloaded_until

    def of_batch(self, headers: Sequence[Mapping[str, Any]], batch_size: int) -> float | None:
        """The estimated wait of a batch of requests with these headers: only a full batch
        stood in a backlog, and only one with a request that carries no start needs it. With
        ``batchSize`` 1 every batch is full, so fullness says nothing: no estimate."""
        if batch_size < 2 or len(headers) < batch_size:
            return None
        if all(start_time(one) is not None for one in headers):
            return None
        return self.seconds()
