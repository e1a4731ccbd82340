"""Worker crash: SIGKILL the Python worker under load (concurrency 8). TorchServe must restart
it (a new pid, a 200 within 60 s), and every request sent must end in a response or a counted
client-side error (30 s timeout each): none may be lost silently."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psutil
from bert_serve_server.control import Server

from lab.chaos.common import (
    RECOVERY_LIMIT_S,
    REQUEST_TIMEOUT_S,
    Durations,
    closed_loop,
    part_server,
    ping_status,
)
from lab.corpus import make_corpus
from lab.load import ClosedLoop, Outcome, json_job, statuses


@dataclass
class Crash:
    """What happened around the kill; times are time.monotonic()."""

    old_pid: int | None = None
    workers_before: int = 0
    killed_at: float | None = None
    first_200_at: float | None = None
    new_pid: int | None = None
    replaced_at: float | None = None
    error: str | None = None

    def seconds_after_kill(self, moment: float | None) -> float | None:
        if moment is None or self.killed_at is None:
            return None
        return round(moment - self.killed_at, 2)


def first_200_after(outcomes: list[Outcome], moment: float) -> Outcome | None:
    """The earliest 200 to a request sent after ``moment`` (so the new worker answered it)."""
    after = [o for o in outcomes if o.status == "200" and o.sent > moment]
    return min(after, key=lambda o: o.done, default=None)


async def kill_first_worker(server: Server, crash: Crash) -> set[int]:
    """SIGKILL the first listed worker; the pids before the kill."""
    before = await asyncio.to_thread(server.workers)
    if not before:
        raise RuntimeError("the management API lists no worker to kill")
    crash.workers_before = len(before)
    crash.old_pid = before[0].pid
    await asyncio.to_thread(server.kill_worker, crash.old_pid)
    crash.killed_at = time.monotonic()
    return {worker.pid for worker in before}


async def watch_replacement(server: Server, crash: Crash, before: set[int], limit: float) -> None:
    """Note the new worker's pid and when it was READY (if within ``limit``)."""
    assert crash.old_pid is not None and crash.killed_at is not None
    try:
        pid, waited = await asyncio.to_thread(server.wait_replaced, crash.old_pid, before, limit)
    except TimeoutError:
        return
    crash.new_pid, crash.replaced_at = pid, crash.killed_at + waited


async def crash_under_load(load: ClosedLoop, server: Server, d: Durations, crash: Crash) -> None:
    """Wait, kill the worker, then keep the load running until a 200 came after the kill and
    the worker was replaced, and a little longer; or until the recovery limit."""
    try:
        await asyncio.sleep(d.crash_before_kill_s)
        before = await kill_first_worker(server, crash)
        assert crash.killed_at is not None
        replacement = asyncio.create_task(watch_replacement(server, crash, before, d.crash_limit_s))
        while time.monotonic() - crash.killed_at < d.crash_limit_s:
            first = first_200_after(load.outcomes, crash.killed_at)
            if crash.first_200_at is None and first is not None:
                crash.first_200_at = first.done
            if crash.first_200_at is not None and crash.replaced_at is not None:
                if time.monotonic() - max(crash.first_200_at, crash.replaced_at) >= (
                    d.crash_after_recovery_s
                ):
                    break
            await asyncio.sleep(0.25)
        await replacement
    except Exception as error:  # reported; the load stops and the part fails
        crash.error = f"{type(error).__name__}: {error}"
    finally:
        load.stopped = True


def process_gone(pid: int | None) -> bool:
    if pid is None:
        return False
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


def first_error_body(outcomes: list[Outcome]) -> str | None:
    """The body of the first non-200 answer, to show what TorchServe said."""
    failed = [o for o in outcomes if o.status != "200" and o.body]
    return failed[0].body.decode(errors="replace")[:300] if failed else None


def verdict(result: dict[str, Any]) -> bool:
    recovery = result["seconds_to_first_200_after_kill"]
    replaced = result["seconds_to_worker_replaced"]
    return (
        recovery is not None
        and recovery <= RECOVERY_LIMIT_S
        and replaced is not None
        and replaced <= RECOVERY_LIMIT_S
        and result["new_pid_differs"]
        and result["silently_lost"] == 0
    )


def run(d: Durations) -> dict[str, Any]:
    corpus = make_corpus()
    crash = Crash()
    with part_server(d) as server:
        load = closed_loop(
            server,
            lambda i: json_job(corpus[i % len(corpus)]),
            8,
            d.crash_before_kill_s + d.crash_limit_s + 5,
        )
        load.run(crash_under_load(load, server, d, crash))
        ping = ping_status(server)
    result: dict[str, Any] = {
        "concurrency": 8,
        "request_timeout_s": REQUEST_TIMEOUT_S,
        "workers": crash.workers_before,
        "requests_sent": load.sent,
        "responses_or_client_errors": len(load.outcomes),
        "silently_lost": load.silently_lost,
        "statuses": crash_phases(load.outcomes, crash.killed_at),
        "killed_worker_pid": crash.old_pid,
        "killed_worker_gone": process_gone(crash.old_pid),
        "new_worker_pid": crash.new_pid,
        "new_pid_differs": crash.new_pid is not None and crash.new_pid != crash.old_pid,
        "seconds_to_first_200_after_kill": crash.seconds_after_kill(crash.first_200_at),
        "seconds_to_worker_replaced": crash.seconds_after_kill(crash.replaced_at),
        "example_error_body": first_error_body(load.outcomes),
        "ping_after": ping,
    }
    if crash.error:
        result["error"] = crash.error
    result["passed"] = verdict(result)
    result["summary"] = (
        f"{crash.workers_before} worker(s), killed {crash.old_pid} -> new {crash.new_pid} "
        f"READY after {result['seconds_to_worker_replaced']} s, first 200 after "
        f"{result['seconds_to_first_200_after_kill']} s, {load.sent} sent, "
        f"{load.silently_lost} silently lost, in flight at kill: "
        f"{result['statuses'].get('in_flight_at_kill')}"
    )
    return result
