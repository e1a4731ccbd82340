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
GAUGE_LINE = re.compile(rf"^{GAUGE}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE)
FETCH_TIMEOUT_S = 0.2
FRESH_FOR_S = 0.005
"""A reading this recent is reused: a run of small full batches reads once."""
RETRY_AFTER_FAILURE_S = 30.0

Fetch = Callable[[str], str]


def metrics_url() -> str:
    """The ``QueueTime`` gauge's address: only that metric is asked for (a short answer)."""
    base = os.environ.get(METRICS_URL_ENV) or DEFAULT_METRICS_URL
    return f"{base}?name[]={GAUGE}"


def queue_time_s(metrics_text: str) -> float | None:
    """The gauge's value in seconds from a Prometheus text answer; None when absent."""
    values = [float(match) for match in GAUGE_LINE.findall(metrics_text)]
    return max(values) / 1e3 if values else None


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

    def seconds(self) -> float | None:
        now = self.clock()
        if now - self._read_at < FRESH_FOR_S:
            return self._value
        if now - self._failed_at < RETRY_AFTER_FAILURE_S:
            return None
        try:
            self._value = queue_time_s(self.fetch(self.url))
        except Exception as error:  # an unreachable or odd endpoint only disables the estimate
            if self._failed_at == float("-inf"):
                logger.warning("frontend queue time unreadable at %s: %s", self.url, error)
            self._failed_at, self._value = now, None
            return None
        self._read_at = now
        return self._value

    def of_batch(self, headers: Sequence[Mapping[str, Any]], batch_size: int) -> float | None:
        """The estimated wait of a batch of requests with these headers: only a full batch
        stood in a backlog, and only one with a request that carries no start needs it. With
        ``batchSize`` 1 every batch is full, so fullness says nothing: no estimate."""
        if batch_size < 2 or len(headers) < batch_size:
            return None
        if all(start_time(one) is not None for one in headers):
            return None
        return self.seconds()
