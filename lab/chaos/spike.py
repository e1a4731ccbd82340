"""Spike: impatient clients over capacity (docs/deadlines.md). One default server; closed-loop
levels in turn: patient clients, then 2x and 4x overload whose clients give up at their deadline
and send again 50 ms after a failure. Each level in three forms (``SPIKE_FORMS``): plain (no
deadline), timeout (``X-Request-Timeout`` alone: undatable, so patient too) and stamped
(``X-Request-Start`` as well, as ``bert_serve.Client`` sends); then LitServe out of the box on
the plain levels, restarted for each (its unbounded queue takes minutes to drain). Per level:
goodput (200s within the deadline per second), answers by status, the frontend's own time, the
handler's expired requests and forward times, the cores each process used.

The verdict holds at any load: nothing lost, no 5xx but 503 and 504. The goodput bars are
reported, not asserted: they need a quiet machine.
"""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from bert_serve_server.archive import DEFAULT_MODEL_DIR

from handler.deadline import TIMEOUT_HEADER
from lab.batchlog import batch_times, observed
from lab.chaos import REQUEST_TIMEOUT_S, SPIKE_FORMS, Durations, latency, part_server
from lab.corpus import make_corpus
from lab.load import ClosedLoop, cores_by_role, in_turn, percentile, server_processes, statuses
from lab.peer import OUT_OF_THE_BOX, litserve_peer
from lab.report import pyplot

PAUSE_AFTER_FAILURE_S = 0.05
ACCESS = re.compile(r'"POST /predictions/\S+ HTTP/[\d.]+" (\d{3}) (\d+)$', re.MULTILINE)
LONE_REQUESTS = 10
SETTLE_LIMIT_S = 300.0


@dataclass(frozen=True)
class Target:
    """Where a level's load goes: our server or the LitServe peer."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    logs: tuple[Path, Path] | tuple[()] = ()
    """The handler's log (its batch lines) and the frontend's access log (its own time per
    answer); none for the peer."""
    processes: Mapping[str, int] = field(default_factory=dict)
    """The server's pids and the load generator's (``server_processes``), for the cores each
    used; empty for the peer."""

    def predict(self, text: str) -> None:
        """One request, raising ``requests.HTTPError`` for an answer other than 2xx."""
        response = requests.post(
            self.url, json={"text": text}, headers=self.headers, timeout=REQUEST_TIMEOUT_S
        )
        response.raise_for_status()


@dataclass(frozen=True)
class Level:
    name: str
    clients: int
    deadline_s: float | None  # None: patient (REQUEST_TIMEOUT_S)
    pause_s: float = PAUSE_AFTER_FAILURE_S


def level_key(level_name: str, form: str) -> str:
    return level_name if form == "plain" else f"{level_name}_{form}"


LEVELS = (
    Level("patient_32", 32, None),
    Level("128_at_0.4s", 128, 0.4),
    Level("256_at_0.5s", 256, 0.5),
    Level("256_at_1s_no_pause", 256, 1.0, pause_s=0.0),
)


def frontend_latency(access_lines: str) -> dict[str, dict[str, float | int]]:
    """By status, the count and p50/p99 of the time each answer spent in the frontend, from
    TorchServe's access log. Beside the client's own times it separates the server's part from
    the load generator's (which shares the CPU)."""
    by_status: dict[str, list[float]] = {}
    for status, ms in ACCESS.findall(access_lines):
        by_status.setdefault(status, []).append(float(ms))
    return {status: latency(values) for status, values in sorted(by_status.items())}


def lone_p50_ms(target: Target, corpus: list[str], warm: bool = False) -> float:
    """The p50 of ``LONE_REQUESTS`` requests one at a time, after 3 unmeasured ones if
    ``warm``."""
    for text in corpus[:3] if warm else []:
        target.predict(text)
    times = []
    for text in corpus[:LONE_REQUESTS]:
        started = time.monotonic()
        target.predict(text)
        times.append((time.monotonic() - started) * 1000)
    return round(percentile(times, 50), 1)


def settle(target: Target, text: str, limit_s: float = SETTLE_LIMIT_S) -> float:
    """Wait until the last level's abandoned queue has drained: a request is answered 200
    (meanwhile a bounded queue answers 503, an unbounded one makes it wait). Returns the
    seconds it took; raises past ``limit_s``."""
    started = time.monotonic()
    while True:
        try:
            target.predict(text)
            return round(time.monotonic() - started, 1)
        except requests.RequestException:
            if time.monotonic() - started > limit_s:
                raise
            time.sleep(0.2)


def run_level(
    target: Target, level: Level, corpus: list[str], seconds: float, form: str = "plain"
) -> dict[str, Any]:
    settle_s = settle(target, corpus[0])
    deadline_s = level.deadline_s or REQUEST_TIMEOUT_S
    headers = target.headers
    if form == "timeout":
        headers = headers | {TIMEOUT_HEADER: f"{deadline_s:g}"}
    load = ClosedLoop(
        target.url,
        headers,
        in_turn(corpus),
        level.clients,
        seconds,
        max_requests=int(seconds * 2000),
        request_timeout_s=deadline_s,
        pause_after_failure_s=level.pause_s,
        stamped=form == "stamped",
    )
    cores, logged = observed(load, target.processes, target.logs)
    in_time = [o for o in load.outcomes if o.status == "200" and o.ms <= deadline_s * 1000]
    by_status = {
        status: latency([o.ms for o in load.outcomes if o.status == status])
        for status in statuses(load.outcomes)
    }
    return {
        "clients": level.clients,
        "deadline_s": level.deadline_s,
        "pause_after_failure_s": level.pause_s,
        "form": form,
        "goodput_per_s": round(len(in_time) / load.elapsed, 1),
        "by_status": by_status,
        "frontend_ms_by_status": frontend_latency(logged[1]) if logged else None,
        "handler_batches": batch_times(logged[0]) if logged else None,
        "cores": cores_by_role(cores) if cores else None,
        "silently_lost": load.silently_lost,
        "drain_before_s": settle_s,
    }


def run_levels(
    target: Target, corpus: list[str], seconds: float, forms: tuple[str, ...]
) -> dict[str, Any]:
    """Every level in each of ``forms``; lone p50 before and after."""
    levels: dict[str, Any] = {}
    lone_before = lone_p50_ms(target, corpus, warm=True)
    for form in forms:
        for level in LEVELS:
            levels[level_key(level.name, form)] = run_level(target, level, corpus, seconds, form)
    drain_after_s = settle(target, corpus[0])
    return {
        "levels": with_ratios(levels),
        "drain_after_s": drain_after_s,
        "lone_p50_ms_before": lone_before,
        "lone_p50_ms_after": lone_p50_ms(target, corpus),
    }


def run_peer_levels(corpus: list[str], seconds: float) -> dict[str, Any]:
    """LitServe out of the box on the plain levels, a fresh peer for each: its queue has no
    bound, so what a level leaves behind takes minutes to drain (a first full run was still
    waiting after five), and the next level would start behind it."""
    levels: dict[str, Any] = {}
    lone_before = None
    for level in LEVELS:
        with litserve_peer(DEFAULT_MODEL_DIR, OUT_OF_THE_BOX) as peer:
            target = Target(peer.url)
            if lone_before is None:
                lone_before = lone_p50_ms(target, corpus, warm=True)
            levels[level.name] = run_level(target, level, corpus, seconds)
    return {
        "levels": with_ratios(levels),
        "restarted_per_level": True,
        "lone_p50_ms_before": lone_before,
    }


def with_ratios(levels: dict[str, Any]) -> dict[str, Any]:
    """Each level's goodput as a share of the same form's patient level's, added in place."""
    for result in levels.values():
        patient = levels[level_key(LEVELS[0].name, result.get("form", "plain"))]
        share = result["goodput_per_s"] / (patient["goodput_per_s"] or 1.0)
        result["goodput_ratio_to_patient"] = round(share, 2)
    return levels


def summary(result: dict[str, Any]) -> str:
    return (
        ", ".join(
            f"{name} {r['goodput_per_s']}/s ({r['goodput_ratio_to_patient']})"
            for name, r in result["levels"].items()
        )
        + f"; lone p50 {result['lone_p50_ms_before']} -> {result.get('lone_p50_ms_after')} ms"
    )


def plot(result: dict[str, Any], out: Path) -> None:
    """``spike.png`` in ``out``: goodput per level, a bar per server and form."""
    results = {"bert-serve": result}
    if "levels" in result["litserve"]:
        results["LitServe"] = result["litserve"]
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(9, 4.5))
    names = [level.name for level in LEVELS]
    series = [
        (server if form == "plain" else f"{server} {form}", server, form)
        for server in results
        for form in SPIKE_FORMS
        if level_key(names[0], form) in results[server]["levels"]
    ]
    width = 0.8 / len(series)
    for index, (label, server, form) in enumerate(series):
        levels = results[server]["levels"]
        values = [levels[level_key(name, form)]["goodput_per_s"] for name in names]
        axes.bar([x + index * width for x in range(len(names))], values, width, label=label)
    axes.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names)
    axes.set_ylabel("answers within the deadline per second")
    axes.set_title("Goodput under a spike of impatient clients")
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "spike.png", dpi=110)
    plt.close(figure)


def run(d: Durations) -> dict[str, Any]:
    """``d.spike_s`` seconds per level, in ``d.spike_forms``, on a server with ``d.spike_set``
    over the config; then LitServe unless ``d.spike_peer`` is off."""
    corpus = make_corpus()
    with part_server(d, d.spike_set) as server:
        logs = (server.model_log, server.access_log)
        ours = Target(server.predict_url, server.headers(), logs, server_processes(server))
        result_all = run_levels(ours, corpus, d.spike_s, d.spike_forms)
    litserve: dict[str, Any] = {"skipped": "litserve is not installed (the dev extra)"}
    if not d.spike_peer:
        litserve = {"skipped": "not asked for (--no-peer)"}
    elif importlib.util.find_spec("litserve") is not None:
        litserve = run_peer_levels(corpus, d.spike_s)
    bad_5xx = {
        name: status
        for name, result in result_all["levels"].items()
        for status in result["by_status"]
        if status.startswith("5") and status not in ("503", "504")
    }
    lost = sum(result["silently_lost"] for result in result_all["levels"].values())
    result_all |= {
        "seconds_per_level": d.spike_s,
        "config_set": d.spike_set,
        "litserve": litserve,
        "other_5xx": bad_5xx,
        "passed": not bad_5xx and lost == 0,
        "summary": f"ours: {summary(result_all)}; LitServe: "
        + (summary(litserve) if "levels" in litserve else litserve["skipped"]),
    }
    return result_all
