"""The one closed-loop load generator (bench, chaos, soak, the image and pod tests all send
their traffic through it), and servers measured with it at a few loads.

``concurrency`` clients each send the next request as soon as their last one ended, until a
count, a time limit or a stop flag ends the run. Every request leaves an ``Outcome`` record
(what was sent, the status or the client-side error, the body, when it was sent and answered),
so a caller can count statuses, take latencies or check each answer. ``interleaved`` measures
several servers in turn at each load, so a slow spell of a shared machine falls on all alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from bert_serve_server.archive import BATCH_KEYS
from bert_serve_server.control import Server, running

from handler.deadline import WAIT_TIME


@dataclass(frozen=True)
class Job:
    """One request to send: ``kind`` says what it is ("valid" or a malformed kind) and
    ``expected`` what should come back (the text, or the error code)."""

    data: bytes
    content_type: str
    kind: str = "valid"
    expected: str = ""
    status: int = 200


def json_job(text: str) -> Job:
    return Job(json.dumps({"text": text}).encode(), "application/json", expected=text)


def in_turn(texts: Sequence[str]) -> Callable[[int], Job]:
    """The n-th request: ``texts`` in turn, each as JSON ``{"text": ...}``."""
    return lambda n: json_job(texts[n % len(texts)])


@dataclass(frozen=True)
class Outcome:
    job: Job
    status: str  # "200", "503", ... or "client_<error>" for a client-side error
    body: bytes
    sent: float  # time.monotonic()
    done: float
    waited_ms: float | None = None
    """The handler's ``x-wait-time`` (stamped requests): from the stamp to its batch's start."""

    @property
    def ms(self) -> float:
        return (self.done - self.sent) * 1000


async def send(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], job: Job
) -> Outcome:
    """Never raises for a failed request: a client-side error is an outcome too."""
    sent = time.monotonic()
    waited_ms = None
    try:
        request_headers = headers | {"Content-Type": job.content_type}
        async with session.post(url, data=job.data, headers=request_headers) as response:
            body = await response.read()
            status = str(response.status)
            if WAIT_TIME in response.headers:
                waited_ms = float(response.headers[WAIT_TIME])
    except TimeoutError:
        body, status = b"", "client_timeout"
    except (aiohttp.ClientError, OSError) as error:
        body, status = b"", f"client_{type(error).__name__}"
    return Outcome(job, status, body, sent, time.monotonic(), waited_ms)


Progress = Callable[[int, float], None]
# Sends one job some other way than a plain POST (e.g. through bert_serve.Client); never raises.
Sender = Callable[[Job], Awaitable[Outcome]]


@dataclass
class ClosedLoop:
    """A bounded closed loop: ``concurrency`` clients, each sending ``job_for(n)`` for the n-th
    request as soon as its last one ended, until ``max_requests`` were sent, ``seconds``
    passed, or ``stopped`` is set. Each request is a POST to ``url`` unless a ``sender`` is
    given. ``pause_after_failure_s``: a client waits that long after an answer other than 200
    (an impatient client's resend). ``stamped``: each POST carries ``X-Request-Start`` and,
    as ``X-Request-Timeout``, ``request_timeout_s`` (docs/deadlines.md). ``new_connections``:
    each request on a connection of its own (what a Service still sends a terminating pod)."""

    url: str
    headers: dict[str, str]
    job_for: Callable[[int], Job]
    concurrency: int
    seconds: float
    max_requests: int | None = None
    request_timeout_s: float = 120.0
    progress: Progress | None = None
    sender: Sender | None = None
    pause_after_failure_s: float = 0.0
    stamped: bool = False
    new_connections: bool = False
    sent: int = 0
    stopped: bool = False
    elapsed: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)

    def run(self, *others: Coroutine[Any, Any, None]) -> ClosedLoop:
        """Run the load, and alongside it ``others`` (e.g. a fault injector)."""
        asyncio.run(self.run_async(*others))
        return self

    @property
    def silently_lost(self) -> int:
        return self.sent - len(self.outcomes)

    def _more(self, deadline: float) -> bool:
        under_count = self.max_requests is None or self.sent < self.max_requests
        return not self.stopped and under_count and time.monotonic() < deadline

    async def run_async(self, *others: Coroutine[Any, Any, None]) -> None:
        """``run`` inside a running event loop (to run two loads side by side)."""
        started = time.monotonic()
        deadline = started + self.seconds
        connector = aiohttp.TCPConnector(limit=self.concurrency, force_close=self.new_connections)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            users = (self._user(session, deadline) for _ in range(self.concurrency))
            await asyncio.gather(self._report(started, deadline), *users, *others)
        self.elapsed = time.monotonic() - started

    async def _user(self, session: aiohttp.ClientSession, deadline: float) -> None:
        while self._more(deadline):
            job = self.job_for(self.sent)
            self.sent += 1
            if self.sender is not None:
                outcome = await self.sender(job)
            else:
                outcome = await send(session, self.url, self._headers_now(), job)
            self.outcomes.append(outcome)
            if outcome.status != "200" and self.pause_after_failure_s > 0:
                await asyncio.sleep(self.pause_after_failure_s)

    def _headers_now(self) -> dict[str, str]:
        if not self.stamped:
            return self.headers
        return self.headers | {
            "X-Request-Start": f"t={time.time():.3f}",
            "X-Request-Timeout": f"{self.request_timeout_s:g}",
        }

    async def _report(self, started: float, deadline: float) -> None:
        while self.progress is not None and self._more(deadline):
            await asyncio.sleep(1)
            self.progress(len(self.outcomes), time.monotonic() - started)


def statuses(outcomes: Sequence[Outcome]) -> dict[str, int]:
    return dict(sorted(Counter(outcome.status for outcome in outcomes).items()))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


def summary(loop: ClosedLoop) -> dict[str, Any]:
    """Requests/s and latency percentiles of the 200s, and every status counted."""
    counts = statuses(loop.outcomes)
    ok = [outcome.ms for outcome in loop.outcomes if outcome.status == "200"]
    elapsed = max(loop.elapsed, 1e-9)
    return {
        "concurrency": loop.concurrency,
        "seconds": round(loop.elapsed, 2),
        "requests": len(loop.outcomes),
        "errors": len(loop.outcomes) - len(ok),
        "statuses": counts,
        "rps": round(len(ok) / elapsed, 2),
        "p50_ms": round(percentile(ok, 50), 1),
        "p90_ms": round(percentile(ok, 90), 1),
        "p99_ms": round(percentile(ok, 99), 1),
    }


def progress_line(label: str, concurrency: int, seconds: float) -> Progress:
    """Prints the run's progress on one stderr line, once a second."""

    def show(done: int, elapsed: float) -> None:
        print(
            f"\r  {label} c={concurrency}: {elapsed:4.0f}/{seconds:.0f} s, {done} requests, "
            f"{done / max(elapsed, 1e-9):6.1f} rps   ",
            end="",
            file=sys.stderr,
            flush=True,
        )

    return show


def run_texts(
    url: str,
    headers: dict[str, str],
    texts: Sequence[str],
    concurrency: int,
    seconds: float,
    label: str = "",
    batch_log: Path | None = None,
) -> dict[str, Any]:
    """``texts`` in turn as JSON ``{"text": ...}`` for ``seconds``: the run's summary, with the
    batches the handler formed meanwhile where ``batch_log`` is its log."""
    from lab.batchlog import batch_summary, observed  # it reads percentiles from here

    progress = progress_line(label, concurrency, seconds)
    loop = ClosedLoop(url, headers, in_turn(texts), concurrency, seconds, progress=progress)
    _, logged = observed(loop, logs=[batch_log] if batch_log else [])
    print(file=sys.stderr)
    return summary(loop) | (batch_summary(logged[0]) if logged else {})


@dataclass(frozen=True)
class Loads:
    """Concurrency levels, measured seconds per level, and the warm-up before each."""

    levels: Sequence[int]
    seconds: float
    warmup: float


def process_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def server_processes(server: Server) -> dict[str, int]:
    """The pids of the frontend, of each worker and of this process (the load generator, which
    shares the machine)."""
    frontend = {"frontend": pid} if (pid := server.pid()) is not None else {}
    workers = {f"worker_{n}": worker.pid for n, worker in enumerate(server.workers())}
    return {"load_generator": os.getpid()} | frontend | workers


@contextmanager
def cores_used(pids: Mapping[str, int]) -> Iterator[dict[str, float]]:
    """The cores each named process used while the block ran (its CPU seconds over the wall
    seconds), filled in when the block ends; a process not running at both ends is left out."""
    cores: dict[str, float] = {}
    before: dict[str, float] = {}
    for name, pid in pids.items():
        with suppress(psutil.Error):
            before[name] = process_cpu_s(pid)
    began = time.monotonic()
    yield cores
    elapsed = max(time.monotonic() - began, 1e-9)
    for name, cpu_s in before.items():
        with suppress(psutil.Error):
            cores[name] = round((process_cpu_s(pids[name]) - cpu_s) / elapsed, 3)


def cores_by_role(cores: Mapping[str, float]) -> dict[str, float]:
    """The cores used by the load generator, the frontend and the workers together."""
    roles = {"load_generator": 0.0, "frontend": 0.0, "workers": 0.0}
    for name, used in cores.items():
        role = "workers" if name.startswith("worker_") else name
        roles[role] = round(roles.get(role, 0.0) + used, 3)
    return roles


@dataclass(frozen=True)
class Endpoint:
    """Something to load: a name, its predict URL and headers, and the handler's log if any."""

    name: str
    url: str
    headers: dict[str, str]
    batch_log: Path | None = None
    paused_between_turns: int | None = None
    """A process group to stop (SIGSTOP) while the others are measured: for a peer whose
    idle processes use CPU."""


def endpoint(name: str, server: Server) -> Endpoint:
    return Endpoint(name, server.predict_url, server.headers(), server.model_log)


def interleaved(
    endpoints: Sequence[Endpoint], corpus: Sequence[str], loads: Loads
) -> dict[str, dict[str, dict[str, Any]]]:
    """{name: {level: load summary}}, every endpoint in turn at each level, so a slow spell
    of a shared machine falls on all of them alike instead of on whichever ran then."""
    results: dict[str, dict[str, dict[str, Any]]] = {item.name: {} for item in endpoints}
    for level in loads.levels:
        for item in endpoints:
            url, headers, name = item.url, item.headers, item.name
            with its_turn(item, endpoints):
                run_texts(url, headers, corpus, level, loads.warmup, f"{name} warm-up")
                summary = run_texts(
                    url, headers, corpus, level, loads.seconds, name, item.batch_log
                )
                results[name][str(level)] = summary
    return results


@contextmanager
def its_turn(current: Endpoint, endpoints: Sequence[Endpoint]) -> Iterator[None]:
    """Every other endpoint that asks for it is paused while ``current`` is measured."""
    others = [item for item in endpoints if item is not current]
    paused = [item.paused_between_turns for item in others if item.paused_between_turns]
    for group in paused:
        os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        for group in paused:
            os.killpg(group, signal.SIGCONT)


@contextmanager
def servers(configs: Mapping[str, dict[str, str]]) -> Iterator[dict[str, dict[str, Any]]]:
    """One TorchServe per named config, started one after another (each one's start-up time
    measured alone), all running until the block ends, then all stopped. Yields {name:
    {"server", "startup_s", "config", "worker_memory"}}, each worker's RSS and USS (the part only
    it holds) in MB after a first request."""
    with ExitStack() as stack:
        started: dict[str, dict[str, Any]] = {}
        for name, overrides in configs.items():
            prefix = "measure-" + re.sub(r"\W+", "-", name) + "-"
            began = time.monotonic()
            server = stack.enter_context(running(overrides, prefix=prefix))
            startup_s = round(time.monotonic() - began, 1)
            model = server.model()
            run_texts(server.predict_url, server.headers(), ["warm"], 1, 0.3, f"{name} first")
            started[name] = {
                "server": server,
                "startup_s": startup_s,
                "config": {key: model[key] for key in BATCH_KEYS},
                "worker_memory": [
                    {"rss_mb": worker.rss_mb, "uss_mb": worker.uss_mb}
                    for worker in server.memory().workers.values()
                ],
            }
        yield started
