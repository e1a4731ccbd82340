"""Spike: impatient clients over capacity (issue 23, docs/deadlines.md).

One server with the default config; closed-loop levels one after another, as an outside load
generator would send them: patient clients first, then 2x and 4x overload whose clients each
give up after their deadline and send again 50 ms after a failure (the last level at once).
Each level runs twice, once plain (what an outside generator sends: no stamps, so only the
frontend's ``job_queue_size`` protects the server) and once stamped (``X-Request-Start`` and
``X-Request-Timeout``, as ``bert_serve.Client`` sends, so the handler also refuses expired
work). Reported per level: goodput (200s within the deadline per second), the other answers
by status with their p50/p99, client timeouts, and the requests the handler expired (its batch
log's ``expired=``); then a lone client's p50 before and after the spike.

The verdict checks only what must hold at any load: every request was answered or reached its
own timeout (none lost), and no 5xx other than 503 (queue full) and 504 (deadline_exceeded).
The issue's bars (goodput ratios, refusal p99) are reported, not asserted: they need a quiet
machine.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import requests

from harness.batchlog import LogWindow
from harness.chaos.common import REQUEST_TIMEOUT_S, Durations, predict
from harness.corpus import make_corpus
from harness.load import ClosedLoop, Outcome, json_job, percentile, statuses
from harness.server import Server, running

PAUSE_AFTER_FAILURE_S = 0.05
EXPIRED = re.compile(r" expired=(\d+)")
LONE_REQUESTS = 10
SETTLE_LIMIT_S = 60.0


@dataclass(frozen=True)
class Level:
    name: str
    clients: int
    deadline_s: float | None  # None: patient (REQUEST_TIMEOUT_S)
    pause_s: float = PAUSE_AFTER_FAILURE_S


LEVELS = (
    Level("patient_32", 32, None),
    Level("128_at_0.4s", 128, 0.4),
    Level("256_at_0.5s", 256, 0.5),
    Level("256_at_1s_no_pause", 256, 1.0, pause_s=0.0),
)


def latency(outcomes: list[Outcome]) -> dict[str, float | int]:
    values = [o.ms for o in outcomes]
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 50), 1),
        "p99_ms": round(percentile(values, 99), 1),
    }


def lone_p50_ms(server: Server, corpus: list[str]) -> float:
    times = []
    for text in corpus[:LONE_REQUESTS]:
        started = time.monotonic()
        predict(server, text)
        times.append((time.monotonic() - started) * 1000)
    return round(percentile(times, 50), 1)


def settle(server: Server, text: str, limit_s: float = SETTLE_LIMIT_S) -> None:
    """Wait until the last level's abandoned queue has drained: a request is answered 200
    (a full queue answers 503 meanwhile)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            predict(server, text)
            return
        except requests.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_level(
    server: Server, level: Level, corpus: list[str], seconds: float, stamped: bool
) -> dict[str, Any]:
    settle(server, corpus[0])
    deadline_s = level.deadline_s or REQUEST_TIMEOUT_S
    load = ClosedLoop(
        server.predict_url,
        server.headers(),
        lambda i: json_job(corpus[i % len(corpus)]),
        level.clients,
        seconds,
        max_requests=int(seconds * 2000),
        request_timeout_s=deadline_s,
        pause_after_failure_s=level.pause_s,
        stamped=stamped,
    )
    with LogWindow(server.model_log) as window:
        load.run()
        expired = sum(int(m.group(1)) for m in EXPIRED.finditer(window.read()))
    in_time = [o for o in load.outcomes if o.status == "200" and o.ms <= deadline_s * 1000]
    by_status = {
        status: latency([o for o in load.outcomes if o.status == status])
        for status in statuses(load.outcomes)
    }
    return {
        "clients": level.clients,
        "deadline_s": level.deadline_s,
        "pause_after_failure_s": level.pause_s,
        "stamped": stamped,
        "goodput_per_s": round(len(in_time) / load.elapsed, 1),
        "by_status": by_status,
        "expired_by_handler": expired,
        "silently_lost": load.silently_lost,
    }


def run(d: Durations) -> dict[str, Any]:
    """``d.spike_s`` seconds per level (``harness.chaos.common.Durations``)."""
    corpus = make_corpus()
    levels: dict[str, Any] = {}
    with running() as server:
        for text in corpus[:3]:
            predict(server, text)
        lone_before = lone_p50_ms(server, corpus)
        for stamped in (False, True):
            for level in LEVELS:
                name = f"{level.name}{'_stamped' if stamped else ''}"
                levels[name] = run_level(server, level, corpus, d.spike_s, stamped)
        settle(server, corpus[0])
        lone_after = lone_p50_ms(server, corpus)
    patient = levels["patient_32"]["goodput_per_s"] or 1.0
    for result in levels.values():
        result["goodput_ratio_to_patient"] = round(result["goodput_per_s"] / patient, 2)
    bad_5xx = {
        name: status
        for name, result in levels.items()
        for status in result["by_status"]
        if status.startswith("5") and status not in ("503", "504")
    }
    lost = sum(result["silently_lost"] for result in levels.values())
    result_all: dict[str, Any] = {
        "seconds_per_level": d.spike_s,
        "levels": levels,
        "lone_p50_ms_before": lone_before,
        "lone_p50_ms_after": lone_after,
        "other_5xx": bad_5xx,
        "passed": not bad_5xx and lost == 0,
    }
    result_all["summary"] = (
        ", ".join(
            f"{name} {r['goodput_per_s']}/s ({r['goodput_ratio_to_patient']})"
            for name, r in levels.items()
        )
        + f"; lone p50 {lone_before} -> {lone_after} ms"
    )
    return result_all
