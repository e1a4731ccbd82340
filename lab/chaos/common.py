"""What the chaos experiments share: their durations, the malformed requests, and a few
bounded requests against a server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import requests
from bert_serve_server.control import REPLACE_LIMIT_S, Server, running

from bert_serve.client import DEFAULT_TIMEOUT_S
from lab.load import ClosedLoop, Job, Outcome, percentile

FORM = "application/x-www-form-urlencoded"
REQUEST_TIMEOUT_S = 30.0
RECOVERY_LIMIT_S = REPLACE_LIMIT_S
SPIKE_FORMS = ("plain", "timeout", "stamped")
"""The spike's request forms (``lab.chaos.spike``)."""
QUICK_ATTEMPT_S = 20.0
"""The quick form's wait for one answer in the kill runs (``Durations.attempt_s``): a request
TorchServe drops at a kill keeps its run waiting this long, not the client's default 70 s.
Healthy answers come well inside it: in the quick runs' heavier level (16 raw clients, 16
Client threads, a worker being replaced) the slowest took 0.63 s on 2 cores (the report's
``slowest_answer_s``)."""


class SharedServer:
    """The server of the default config, started by the first part that asks for it and kept
    for the parts after it that run on that config, until ``close``: the quick form's parts
    take a few seconds each, about what a start takes."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._server: Server | None = None

    def get(self) -> Server:
        if self._server is None:
            self._server = self._stack.enter_context(running())
        return self._server

    def close(self) -> None:
        self._stack.close()


@dataclass(frozen=True)
class Durations:
    soak_s: float
    crash_before_kill_s: float
    crash_after_recovery_s: float
    crash_limit_s: float = RECOVERY_LIMIT_S
    overload_requests: int = 400
    overload_concurrency: int = 200
    kills: int = 50
    long_delay_kills: int = 50
    """Kills per load level of the kill runs at maxBatchDelay 20 ms (``kill_runs_long_delay``)."""
    attempt_s: float = DEFAULT_TIMEOUT_S
    """The kill runs' wait for one answer: the raw clients' deadline, and ``bert_serve.Client``'s
    per-attempt timeout before its retry (the client's default, which docs/chaos/README.md
    gives raw clients too: responseTimeout + 10 s)."""
    spike_s: float = 15.0
    spike_set: dict[str, str] = field(default_factory=dict)
    """config.properties overrides for the spike part's server (``--set``): to compare
    configs or model stores (``model_store=...``) under the same spike."""
    spike_forms: tuple[str, ...] = SPIKE_FORMS
    spike_peer: bool = True
    shared: SharedServer | None = None
    """Where set (the quick form), the parts on the default config run on this one server."""


@contextmanager
def part_server(d: Durations, overrides: dict[str, str] | None = None) -> Iterator[Server]:
    """A part's server: the run's shared one where there is one and the part runs on the
    default config; else one of its own, stopped when the part ends."""
    if d.shared is not None and not overrides:
        yield d.shared.get()
        return
    with running(overrides) as server:
        yield server


def durations(seconds: float, quick: bool, kills: int | None = None) -> Durations:
    """``kills`` per load level of the kill runs, 50 by default; in the quick form 2 (a
    replaced worker killed again), and 1 in the long-delay runs (their wider window), each
    answer waited for ``QUICK_ATTEMPT_S``."""
    if quick:
        return Durations(
            soak_s=min(seconds, 4.0),
            crash_before_kill_s=1.0,
            crash_after_recovery_s=1.0,
            kills=2 if kills is None else kills,
            long_delay_kills=1 if kills is None else kills,
            attempt_s=QUICK_ATTEMPT_S,
            spike_s=2.0,
        )
    return Durations(
        soak_s=seconds,
        crash_before_kill_s=3.0,
        crash_after_recovery_s=5.0,
        kills=50 if kills is None else kills,
        long_delay_kills=50 if kills is None else kills,
    )


def malformed(kind: str, data: bytes, content_type: str, code: str, status: int = 400) -> Job:
    return Job(data, content_type, kind=kind, expected=code, status=status)


MALFORMED = (
    malformed("empty_text", b"  \n\t ", "text/plain", "empty_text"),
    malformed("missing_field", b'{"txt": "hi"}', "application/json", "missing_field"),
    malformed("invalid_type", b'{"text": 42}', "application/json", "invalid_type"),
    malformed("invalid_json", b'{"text": "unterminated', "application/json", "invalid_json"),
    malformed("invalid_encoding", b"caf\xc3\xa9 \xff\xfe", "text/plain", "invalid_encoding"),
    malformed("payload_too_large", b"a" * 10_001, "text/plain", "payload_too_large", 413),
    malformed("form_without_text", b"great film", FORM, "missing_field"),
)
"""Every kind of malformed request the validator knows, with the status and code it gets."""


def closed_loop(
    server: Server,
    job_for: Callable[[int], Job],
    concurrency: int,
    seconds: float,
    max_requests: int | None = None,
) -> ClosedLoop:
    """A load on the server's predictions endpoint, each request bounded by REQUEST_TIMEOUT_S."""
    return ClosedLoop(
        server.predict_url,
        server.headers(),
        job_for,
        concurrency,
        seconds,
        max_requests=max_requests,
        request_timeout_s=REQUEST_TIMEOUT_S,
    )


def predict(server: Server, text: str) -> dict[str, Any]:
    response = requests.post(
        server.predict_url,
        json={"text": text},
        headers=server.headers(),
        timeout=REQUEST_TIMEOUT_S,
    )
    response.raise_for_status()
    return dict(response.json())


def ping_status(server: Server) -> int | str:
    try:
        url = f"{server.inference_url}/ping"
        return requests.get(url, headers=server.headers(), timeout=10).status_code
    except requests.RequestException as error:
        return f"client_{type(error).__name__}"


def error_code(body: bytes) -> str | None:
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def latency(outcomes: list[Outcome]) -> dict[str, float | int]:
    values = [o.ms for o in outcomes]
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 50), 1),
        "p99_ms": round(percentile(values, 99), 1),
    }
