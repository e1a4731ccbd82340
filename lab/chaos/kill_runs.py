"""Worker kills: one under load (``worker_crash``), then the kill runs, many kills counting the
requests that get no answer.

``worker_crash``: SIGKILL a worker under load (concurrency 8). TorchServe must replace it (a new
pid READY and a 200 after the kill, within 60 s), and every request sent must end in a response
or a counted client-side error (30 s timeout each): none may be lost silently.

Kill runs: TorchServe 0.12 drops, unanswered, the requests a dying worker's frontend thread had
collected for its next batch (docs/chaos/README.md); one kill rarely hits that window. For each
load level (1 raw HTTP client and 1 ``bert_serve.Client``; 16 of each) a random READY worker is
killed ``kills`` times, each after a random pause once all are READY again, with a probe of each
kind right after it. Counted: raw HTTP's answers and requests unanswered within
``Durations.attempt_s``; the Client's (defaults: retries, backoff) failed calls and calls past
its own worst case (``client_hung``). The bar: no failed and no hung Client call.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psutil
from bert_serve_server.config import models_entry
from bert_serve_server.control import Server

from bert_serve.client import BertServeError, Client
from lab.chaos import (
    RECOVERY_LIMIT_S,
    REQUEST_TIMEOUT_S,
    Durations,
    closed_loop,
    part_server,
    ping_status,
)
from lab.corpus import make_corpus
from lab.load import ClosedLoop, Job, Outcome, in_turn, json_job, percentile, send, statuses

MAX_PAUSE_S = 2.0
SETTLE_S = 2.0
HUNG = "client_hung"
WORKER_DIED = b"Worker died."
LONG_DELAY_MS = 20


@dataclass(frozen=True)
class Level:
    name: str
    raw_clients: int
    client_threads: int


LEVELS = (Level("light", 1, 1), Level("heavy", 16, 16))


class ClientSender:
    """Sends a job's text with ``Client.classify`` (the client's defaults) in a thread of its
    own pool. A call that has not returned within the client's worst case (every attempt
    timing out, every backoff at its cap) is recorded as ``client_hung``; a raised error as
    ``client_error_<code>``. The client's sleep hook counts its retries, per call."""

    def __init__(self, server: Server, threads: int, attempt_s: float) -> None:
        self.client = Client(
            server.inference_url,
            token=server.key("inference"),
            timeout=attempt_s,
            sleep=self._sleep,
        )
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kill-runs")
        attempts = self.client.retries + 1
        self.limit_s = (
            attempts * self.client.timeout + self.client.retries * self.client.max_backoff + 5
        )
        self.local = threading.local()
        self.lock = threading.Lock()
        self.retries = 0
        self.calls_retried = 0

    def _sleep(self, seconds: float) -> None:
        self.local.retries += 1
        time.sleep(seconds)

    def _call(self, text: str) -> tuple[str, bytes]:
        self.local.retries = 0
        try:
            prediction = self.client.classify(text)
            status, body = "200", json.dumps(prediction.scores).encode()
        except BertServeError as error:
            status, body = f"client_error_{error.code}", str(error).encode()
        except Exception as error:  # recorded: a sender never raises
            status, body = f"client_error_{type(error).__name__}", str(error).encode()
        with self.lock:
            self.retries += self.local.retries
            self.calls_retried += self.local.retries > 0
        return status, body

    async def __call__(self, job: Job) -> Outcome:
        sent = time.monotonic()
        call = asyncio.get_running_loop().run_in_executor(self.pool, self._call, job.expected)
        try:
            status, body = await asyncio.wait_for(call, self.limit_s)
        except TimeoutError:
            status, body = HUNG, b""
        return Outcome(job, status, body, sent, time.monotonic())

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class KillLog:
    """What the kill series of ``kills`` did; the probes are tasks awaited before it ends."""

    kills: int
    pids: list[int] = field(default_factory=list)
    replaced_s: list[float] = field(default_factory=list)
    raw_probes: list[asyncio.Task[Outcome]] = field(default_factory=list)
    client_probes: list[asyncio.Task[Outcome]] = field(default_factory=list)
    error: str | None = None


async def kill_random_worker(server: Server, rng: random.Random) -> tuple[int, set[int]]:
    """SIGKILL one READY worker; (its pid, every worker's pid before the kill)."""
    workers = await asyncio.to_thread(server.workers)
    ready = sorted(worker.pid for worker in workers if worker.ready)
    if not ready:
        raise RuntimeError("no READY worker to kill")
    pid = rng.choice(ready)
    await asyncio.to_thread(server.kill_worker, pid)
    return pid, {worker.pid for worker in workers}


def process_gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def crash_phases(outcomes: list[Outcome], killed_at: float | None) -> dict[str, dict[str, int]]:
    if killed_at is None:
        return {"before_kill": statuses(outcomes)}
    return {
        "before_kill": statuses([o for o in outcomes if o.done <= killed_at]),
        "in_flight_at_kill": statuses([o for o in outcomes if o.sent <= killed_at < o.done]),
        "sent_after_kill": statuses([o for o in outcomes if o.sent > killed_at]),
    }


def worker_crash(d: Durations) -> dict[str, Any]:
    """One worker killed under load (the module docstring): the load runs on until the worker
    was replaced and ``crash_after_recovery_s`` more."""
    corpus = make_corpus()
    crash: dict[str, Any] = {}
    with part_server(d) as server:
        seconds = d.crash_before_kill_s + RECOVERY_LIMIT_S + 5
        load = closed_loop(server, in_turn(corpus), 8, seconds)

        async def kill_once() -> None:
            try:
                await asyncio.sleep(d.crash_before_kill_s)
                pid, before = await kill_random_worker(server, random.Random(0))
                crash.update(pid=pid, workers=len(before), killed_at=time.monotonic())
                crash["new_pid"], crash["replaced_s"] = await asyncio.to_thread(
                    server.wait_replaced, pid, before, RECOVERY_LIMIT_S
                )
                await asyncio.sleep(d.crash_after_recovery_s)
            except Exception as error:  # reported; the load stops and the part fails
                crash["error"] = f"{type(error).__name__}: {error}"
            finally:
                load.stopped = True

        load.run(kill_once())
        ping = ping_status(server)
    killed_at, old, new = crash.get("killed_at"), crash.get("pid"), crash.get("new_pid")
    answered = [o.done for o in load.outcomes if o.status == "200" and o.sent > (killed_at or 0)]
    first_200_s = round(min(answered) - killed_at, 2) if killed_at and answered else None
    replaced_s = round(crash["replaced_s"], 2) if "replaced_s" in crash else None
    failed = [o for o in load.outcomes if o.status != "200" and o.body]
    result: dict[str, Any] = {
        "concurrency": 8,
        "request_timeout_s": REQUEST_TIMEOUT_S,
        "workers": crash.get("workers", 0),
        "requests_sent": load.sent,
        "responses_or_client_errors": len(load.outcomes),
        "silently_lost": load.silently_lost,
        "statuses": crash_phases(load.outcomes, killed_at),
        "killed_worker_pid": old,
        "killed_worker_gone": old is not None and process_gone(old),
        "new_worker_pid": new,
        "new_pid_differs": new is not None and new != old,
        "seconds_to_first_200_after_kill": first_200_s,
        "seconds_to_worker_replaced": replaced_s,
        "example_error_body": failed[0].body.decode(errors="replace")[:300] if failed else None,
        "ping_after": ping,
    } | ({"error": crash["error"]} if "error" in crash else {})
    result["passed"] = (
        first_200_s is not None
        and first_200_s <= RECOVERY_LIMIT_S
        and replaced_s is not None
        and result["new_pid_differs"]
        and load.silently_lost == 0
    )
    result["summary"] = (
        f"{result['workers']} worker(s), killed {old} -> new {new} READY after {replaced_s} s, "
        f"first 200 after {first_200_s} s, {load.sent} sent, {load.silently_lost} silently "
        f"lost, in flight at kill: {result['statuses'].get('in_flight_at_kill')}"
    )
    return result


async def kill_series(
    server: Server, loads: list[ClosedLoop], prober: ClientSender, rng: random.Random, log: KillLog
) -> None:
    """Kills ``log.kills`` workers at random moments, each once all are READY again, with a raw
    request and a Client call sent right after it (awaited before the end); then stops the
    loads."""
    texts = make_corpus()
    url, headers = server.predict_url, server.headers()
    timeout = aiohttp.ClientTimeout(total=prober.client.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            for _ in range(log.kills):
                await asyncio.sleep(rng.uniform(0, MAX_PAUSE_S))
                pid, before = await kill_random_worker(server, rng)
                log.pids.append(pid)
                job = json_job(rng.choice(texts))
                log.raw_probes.append(asyncio.create_task(send(session, url, headers, job)))
                log.client_probes.append(asyncio.create_task(prober(job)))
                replaced = server.wait_replaced
                _, waited = await asyncio.to_thread(replaced, pid, before, RECOVERY_LIMIT_S)
                log.replaced_s.append(waited)
            await asyncio.sleep(SETTLE_S)
        except Exception as error:  # reported; the loads stop and the part fails
            log.error = f"{type(error).__name__}: {error}"
        finally:
            for load in loads:
                load.stopped = True
            await asyncio.gather(*log.raw_probes, *log.client_probes)


def raw_counts(outcomes: list[Outcome]) -> dict[str, Any]:
    """``slowest_answer_s``: the longest wait for an HTTP answer, to hold against the deadline."""
    answered = [o.ms for o in outcomes if o.status.isdigit()]
    return {
        "requests": len(outcomes),
        "statuses": statuses(outcomes),
        "no_answer_within_deadline": sum(o.status == "client_timeout" for o in outcomes),
        "worker_died_answers": sum(WORKER_DIED in o.body for o in outcomes),
        "slowest_answer_s": round(max(answered, default=0.0) / 1000, 2),
    }


def client_counts(outcomes: list[Outcome], sender: ClientSender) -> dict[str, Any]:
    """``retried_calls``: calls that got their answer only after a retry (a "Worker died."
    answer, a 503 or an attempt nobody answered); ``slower_than_one_attempt``: calls that
    outlived one attempt's deadline, i.e. that had an attempt nobody answered."""
    return {
        "calls": len(outcomes),
        "statuses": statuses(outcomes),
        "failed": sum(o.status not in ("200", HUNG) for o in outcomes),
        "hung": sum(o.status == HUNG for o in outcomes),
        "retried_calls": sender.calls_retried,
        "retries": sender.retries,
        "slower_than_one_attempt": sum(o.ms > sender.client.timeout * 1000 for o in outcomes),
    }


def run_level(
    server: Server, level: Level, kills: int, seed: int, attempt_s: float
) -> dict[str, Any]:
    """One load level: the loads, the kill series beside them, and what every request got,
    each answer waited for ``attempt_s``."""
    sender = ClientSender(server, level.client_threads, attempt_s)
    probe_sender = ClientSender(server, kills, attempt_s)
    bound_s = kills * (MAX_PAUSE_S + RECOVERY_LIMIT_S) + 60
    job_for, url, headers = in_turn(make_corpus()), server.predict_url, server.headers()
    raw = ClosedLoop(url, headers, job_for, level.raw_clients, bound_s, request_timeout_s=attempt_s)
    calls = ClosedLoop(url, headers, job_for, level.client_threads, bound_s, sender=sender)
    log, rng = KillLog(kills), random.Random(seed)
    try:
        raw.run(calls.run_async(), kill_series(server, [raw, calls], probe_sender, rng, log))
    finally:
        sender.close()
        probe_sender.close()
    result: dict[str, Any] = {
        "raw_clients": level.raw_clients,
        "client_threads": level.client_threads,
        "kills": len(log.pids),
        "seconds": round(raw.elapsed, 1),
        "worker_replaced_s": {
            "p50": round(percentile(log.replaced_s, 50), 2),
            "max": round(max(log.replaced_s, default=0.0), 2),
        },
        "raw_http": raw_counts(raw.outcomes),
        "raw_probes": raw_counts([task.result() for task in log.raw_probes]),
        "client": client_counts(calls.outcomes, sender),
        "client_probes": client_counts([t.result() for t in log.client_probes], probe_sender),
        "silently_lost": raw.silently_lost + calls.silently_lost,
    }
    if log.error:
        result["error"] = log.error
    return result


TOTALS = {
    "raw_no_answer": ("raw", "no_answer_within_deadline"),
    "raw_worker_died": ("raw", "worker_died_answers"),
    "raw_requests": ("raw", "requests"),
    "client_calls": ("client", "calls"),
    "client_failed": ("client", "failed"),
    "client_hung": ("client", "hung"),
    "client_retried_calls": ("client", "retried_calls"),
    "client_retried_unanswered": ("client", "slower_than_one_attempt"),
}
"""The counts the verdict and the summary use: name -> (kind, key), summed over every level's
load and probes of that kind."""


def totals(levels: dict[str, dict[str, Any]]) -> dict[str, int]:
    parts = {"raw": ("raw_http", "raw_probes"), "client": ("client", "client_probes")}
    return {
        name: sum(int(level[part][key]) for level in levels.values() for part in parts[kind])
        for name, (kind, key) in TOTALS.items()
    }


def kill_runs_with(d: Durations, overrides: dict[str, str] | None, kills: int) -> dict[str, Any]:
    """Every load level on one server started with ``overrides``, ``kills`` kills each."""
    with part_server(d, overrides) as server:
        model = server.model()
        levels = {
            level.name: run_level(server, level, kills, seed, d.attempt_s)
            for seed, level in enumerate(LEVELS)
        }
    counts = totals(levels)
    complete = all(
        level["kills"] == kills and "error" not in level and level["silently_lost"] == 0
        for level in levels.values()
    )
    result: dict[str, Any] = {
        "kills_per_level": kills,
        "workers": len(model.get("workers", [])),
        "batch_size": model.get("batchSize"),
        "max_batch_delay_ms": model.get("maxBatchDelay"),
        "no_answer_deadline_s": d.attempt_s,
        "client_settings": {"timeout_s": d.attempt_s, "retries": Client().retries},
        "levels": levels,
        **counts,
    }
    result["passed"] = complete and counts["client_failed"] == counts["client_hung"] == 0
    result["summary"] = (
        f"{kills} kills x {len(levels)} loads, maxBatchDelay {result['max_batch_delay_ms']} ms: "
        f"raw HTTP {counts['raw_no_answer']} of {counts['raw_requests']} unanswered within "
        f"{d.attempt_s:.0f} s, {counts['raw_worker_died']} 'Worker died.'; Client "
        f"{counts['client_failed']} failed, {counts['client_hung']} hung of "
        f"{counts['client_calls']} ({counts['client_retried_calls']} answered after a retry)"
    )
    return result


def run(d: Durations) -> dict[str, Any]:
    """The kill runs with the server's own batch settings (config/config.properties)."""
    return kill_runs_with(d, None, d.kills)


def run_long_delay(d: Durations) -> dict[str, Any]:
    """The same with maxBatchDelay 20 ms (the default before 2 ms): a ten times wider window."""
    overrides = {"models": models_entry(max_batch_delay=LONG_DELAY_MS)}
    return kill_runs_with(d, overrides, d.long_delay_kills)
