"""The chaos experiments: faults and overload against a real TorchServe.

Five parts, each on its own TorchServe (free 127.0.0.1 ports, a temporary state folder,
always stopped at the end), each with a pass/fail verdict computed from its numbers:

- ``poisoning_soak``: a concurrency-16 closed loop for --seconds, about 10 % of it malformed
  (every kind the validator knows, in turn). Every valid answer must be 200 with the scores
  its text gets when sent alone (within 1e-4), every malformed one its own 4xx and code.
- ``worker_crash``: SIGKILL the Python worker under load (concurrency 8). TorchServe must
  restart it (a new pid, a 200 within 60 s), and every request sent must end in a response or
  a counted client-side error (30 s timeout each): none may be lost silently.
- ``overload``: ``job_queue_size=8`` and a burst of 400 requests on 200 connections: the
  excess must get 503s, nothing may get another 5xx, and /ping must still answer. Also
  reports latencies by status and the frontend's and worker's RSS before and after.
- ``oversized``: a body of 1 MiB + 1 byte gets the frontend's 413; then /ping and a valid
  prediction still answer 200.
- ``restart``: answers for 5 texts, stop, a second server in the same state folder (same
  ports) starts without any cleanup and gives the same answers (within 1e-6).

Every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psutil
import requests

from bert_serve.harness.batchlog import LogWindow, batch_summary
from bert_serve.harness.config import local_port_overrides
from bert_serve.harness.corpus import make_corpus
from bert_serve.harness.load import ClosedLoop, Job, Outcome, json_job, percentile, statuses
from bert_serve.harness.server import Server, ServerError, running, start, stop

FORM = "application/x-www-form-urlencoded"
REQUEST_TIMEOUT_S = 30.0
SCORE_TOLERANCE = 1e-4
RESTART_TOLERANCE = 1e-6
RECOVERY_LIMIT_S = 60.0
ONE_MIB = 1024 * 1024


@dataclass(frozen=True)
class Durations:
    soak_s: float
    crash_before_kill_s: float
    crash_after_recovery_s: float
    crash_limit_s: float = RECOVERY_LIMIT_S
    overload_requests: int = 400
    overload_concurrency: int = 200


def durations(seconds: float, quick: bool) -> Durations:
    if quick:
        return Durations(
            soak_s=min(seconds, 4.0), crash_before_kill_s=1.0, crash_after_recovery_s=1.0
        )
    return Durations(soak_s=seconds, crash_before_kill_s=3.0, crash_after_recovery_s=5.0)


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


def valid_jobs(text: str) -> list[Job]:
    """The same text as JSON, as a raw text/plain body and as a urlencoded form field."""
    return [
        json_job(text),
        Job(text.encode(), "text/plain", expected=text),
        Job(urlencode({"text": text}).encode(), FORM, expected=text),
    ]


# --- requests and processes ----------------------------------------------------------


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


def is_worker_of(server: Server, pid: int) -> bool:
    """True if ``pid`` is a process the frontend of this server started (so safe to kill)."""
    frontend = server.pid()
    if frontend is None:
        return False
    return pid in {child.pid for child in psutil.Process(frontend).children(recursive=True)}


def rss_mb(pid: int | None) -> float | None:
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1) if pid else None
    except psutil.Error:
        return None


def error_code(body: bytes) -> str | None:
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def score_diff(body: bytes, reference: dict[str, float]) -> float | None:
    """Largest score difference to ``reference``; None if the body is not such a prediction."""
    try:
        scores = json.loads(body)["scores"]
        if set(scores) != set(reference):
            return None
        return max(abs(float(scores[label]) - value) for label, value in reference.items())
    except (ValueError, KeyError, TypeError):
        return None


# --- 1. poisoning soak ---------------------------------------------------------------------


def soak_job(index: int, valid: list[Job]) -> Job:
    """Every 10th request is malformed, cycling through every kind; the rest cycle the valid."""
    if index % 10 == 9:
        return MALFORMED[(index // 10) % len(MALFORMED)]
    return valid[(index // 10 * 9 + index % 10) % len(valid)]


def valid_verdict(outcome: Outcome, alone: dict[str, dict[str, float]]) -> tuple[str, float]:
    """("ok" | "failed" | "changed", score difference) of one valid request."""
    if outcome.status != "200":
        return "failed", 0.0
    diff = score_diff(outcome.body, alone[outcome.job.expected])
    if diff is None:
        return "failed", 0.0
    return ("ok" if diff <= SCORE_TOLERANCE else "changed"), diff


def check_valid(outcomes: list[Outcome], alone: dict[str, dict[str, float]]) -> dict[str, Any]:
    verdicts = [valid_verdict(outcome, alone) for outcome in outcomes]
    counts = Counter(verdict for verdict, _ in verdicts)
    return {
        "valid_sent": len(outcomes),
        "valid_ok": counts["ok"],
        "valid_failed": counts["failed"],
        "valid_changed": counts["changed"],
        "valid_failed_statuses": statuses([o for o in outcomes if o.status != "200"]),
        "max_score_diff": max((diff for _, diff in verdicts), default=0.0),
    }


def check_malformed(outcomes: list[Outcome]) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = {job.kind: Counter() for job in MALFORMED}
    wrong = []
    for outcome in outcomes:
        code = error_code(outcome.body)
        by_kind[outcome.job.kind][f"{outcome.status} {code}"] += 1
        if outcome.status != str(outcome.job.status) or code != outcome.job.expected:
            wrong.append(f"{outcome.job.kind}: {outcome.status} {code}")
    return {
        "malformed_sent": len(outcomes),
        "malformed_by_code": {kind: dict(counts) for kind, counts in by_kind.items()},
        "expected": {job.kind: f"{job.status} {job.expected}" for job in MALFORMED},
        "malformed_wrong": len(wrong),
        "malformed_wrong_examples": wrong[:10],
    }


def poisoning_soak(d: Durations) -> dict[str, Any]:
    texts = make_corpus()[:20]
    valid = [job for text in texts for job in valid_jobs(text)]
    with running() as server:
        alone = {text: predict(server, text)["scores"] for text in texts}
        load = closed_loop(server, lambda i: soak_job(i, valid), 16, d.soak_s)
        with LogWindow(server.model_log) as window:
            load.run()
            time.sleep(0.5)
            batches = batch_summary(window.read())
    result: dict[str, Any] = {"seconds": d.soak_s, "concurrency": 16, "distinct_texts": len(texts)}
    result |= {"requests_sent": load.sent, "silently_lost": load.silently_lost}
    result |= check_valid([o for o in load.outcomes if o.job.kind == "valid"], alone)
    result |= check_malformed([o for o in load.outcomes if o.job.kind != "valid"])
    result["batches"] = batches
    result["passed"] = (
        result["valid_failed"] == result["valid_changed"] == result["malformed_wrong"] == 0
        and result["silently_lost"] == 0
        and result["malformed_sent"] > 0
    )
    result["summary"] = (
        f"{load.sent} requests, {result['valid_ok']} valid ok, {result['valid_failed']} failed, "
        f"{result['valid_changed']} changed, {result['malformed_sent']} malformed "
        f"({result['malformed_wrong']} wrong), max batch {batches['max_batch_size']}"
    )
    return result


# --- 2. worker crash -----------------------------------------------------------------------


def first_200_after(outcomes: list[Outcome], moment: float) -> Outcome | None:
    """The earliest 200 to a request sent after ``moment`` (so the new worker answered it)."""
    after = [o for o in outcomes if o.status == "200" and o.sent > moment]
    return min(after, key=lambda o: o.done, default=None)


@dataclass
class Crash:
    """What happened around the kill; times are time.monotonic()."""

    old_pid: int | None = None
    pids_before: set[int] = field(default_factory=set)
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


def replacement_pid(server: Server, crash: Crash) -> int | None:
    """The new worker's pid once every worker is READY again, the killed pid is gone from the
    list and a pid not seen before the kill is among them; None until then."""
    try:
        current = server.workers()
        pids = {int(w["pid"]) for w in current}
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
        return None
    ready = len(current) == crash.workers_before and all(
        w.get("status") == "READY" for w in current
    )
    new = pids - crash.pids_before
    return min(new) if ready and crash.old_pid not in pids and new else None


async def kill_first_worker(server: Server, crash: Crash) -> None:
    """SIGKILL [0]["workers"][0]["pid"], that pid only, after checking the frontend started it."""
    before = await asyncio.to_thread(server.workers)
    crash.pids_before = {int(w["pid"]) for w in before}
    crash.workers_before = len(before)
    crash.old_pid = int(before[0]["pid"])
    if not await asyncio.to_thread(is_worker_of, server, crash.old_pid):
        raise RuntimeError(f"pid {crash.old_pid} is not a child of the frontend; not killed")
    os.kill(crash.old_pid, signal.SIGKILL)
    crash.killed_at = time.monotonic()


async def watch_recovery(load: ClosedLoop, server: Server, crash: Crash) -> None:
    """Note the first 200 after the kill and the worker's replacement (both bounded by the
    caller's time limit)."""
    assert crash.killed_at is not None
    first = first_200_after(load.outcomes, crash.killed_at)
    if crash.first_200_at is None and first is not None:
        crash.first_200_at = first.done
    if crash.new_pid is None:
        crash.new_pid = await asyncio.to_thread(replacement_pid, server, crash)
        crash.replaced_at = time.monotonic() if crash.new_pid is not None else None


async def crash_under_load(load: ClosedLoop, server: Server, d: Durations, crash: Crash) -> None:
    """Wait, kill the worker, then keep the load running until a 200 came after the kill and
    the worker was replaced, and a little longer; or until the recovery limit."""
    try:
        await asyncio.sleep(d.crash_before_kill_s)
        await kill_first_worker(server, crash)
        assert crash.killed_at is not None
        while time.monotonic() - crash.killed_at < d.crash_limit_s:
            await watch_recovery(load, server, crash)
            if crash.first_200_at is not None and crash.replaced_at is not None:
                latest = max(crash.first_200_at, crash.replaced_at)
                if time.monotonic() - latest >= d.crash_after_recovery_s:
                    break
            await asyncio.sleep(0.25)
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


def crash_verdict(result: dict[str, Any]) -> bool:
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


def worker_crash(d: Durations) -> dict[str, Any]:
    corpus = make_corpus()
    crash = Crash()
    with running() as server:
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
    result["passed"] = crash_verdict(result)
    result["summary"] = (
        f"{crash.workers_before} worker(s), killed {crash.old_pid} -> new {crash.new_pid} "
        f"READY after {result['seconds_to_worker_replaced']} s, first 200 after "
        f"{result['seconds_to_first_200_after_kill']} s, {load.sent} sent, "
        f"{load.silently_lost} silently lost, in flight at kill: "
        f"{result['statuses'].get('in_flight_at_kill')}"
    )
    return result


# --- 3. overload ---------------------------------------------------------------------------


def latency_ms(outcomes: list[Outcome]) -> dict[str, float | int]:
    values = [o.ms for o in outcomes]
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 50), 1),
        "p99_ms": round(percentile(values, 99), 1),
    }


def memory(server: Server) -> dict[str, Any]:
    """RSS of the frontend and of every worker (pids from the management API)."""
    per_worker = {str(w["pid"]): rss_mb(int(w["pid"])) for w in server.workers()}
    return {
        "frontend_rss_mb": rss_mb(server.pid()),
        "worker_rss_mb": per_worker,
        "workers_total_rss_mb": round(sum(v or 0.0 for v in per_worker.values()), 1),
    }


def overload(d: Durations) -> dict[str, Any]:
    corpus = make_corpus()
    with running({"job_queue_size": "8"}) as server:
        for text in corpus[:3]:
            predict(server, text)
        before = memory(server)
        load = closed_loop(
            server,
            lambda i: json_job(corpus[i % len(corpus)]),
            d.overload_concurrency,
            120,
            d.overload_requests,
        )
        load.run()
        after = memory(server)
        ping = ping_status(server)
    rejected = [o for o in load.outcomes if o.status == "503"]
    counts = statuses(load.outcomes)
    other_5xx = {s: n for s, n in counts.items() if s.startswith("5") and s != "503"}
    result: dict[str, Any] = {
        "job_queue_size": 8,
        "requests": load.sent,
        "concurrency": d.overload_concurrency,
        "statuses": counts,
        "latency_503": latency_ms(rejected),
        "latency_200": latency_ms([o for o in load.outcomes if o.status == "200"]),
        "example_503_body": rejected[0].body.decode(errors="replace")[:300] if rejected else None,
        "other_5xx": other_5xx,
        "silently_lost": load.silently_lost,
        "rss_before": before,
        "rss_after": after,
        "ping_after": ping,
    }
    result["passed"] = bool(rejected) and not other_5xx and ping == 200
    result["summary"] = (
        f"{counts}, 503 p50/p99 {result['latency_503']['p50_ms']}/{result['latency_503']['p99_ms']} ms, "
        f"200 p50/p99 {result['latency_200']['p50_ms']}/{result['latency_200']['p99_ms']} ms, "
        f"frontend RSS {before['frontend_rss_mb']} -> {after['frontend_rss_mb']} MB, "
        f"workers {before['workers_total_rss_mb']} -> {after['workers_total_rss_mb']} MB"
    )
    return result


# --- 4. oversized --------------------------------------------------------------------------


def post_raw(server: Server, data: bytes) -> tuple[int | str, str]:
    headers = server.headers() | {"Content-Type": "text/plain"}
    try:
        response = requests.post(
            server.predict_url, data=data, headers=headers, timeout=REQUEST_TIMEOUT_S
        )
        return response.status_code, response.text[:300]
    except requests.RequestException as error:
        return f"client_{type(error).__name__}", ""


def oversized(d: Durations) -> dict[str, Any]:
    with running() as server:
        status, body = post_raw(server, b"a" * (ONE_MIB + 1))
        ping = ping_status(server)
        valid_status, _ = post_raw(server, b"An absolute delight from start to finish.")
    result: dict[str, Any] = {
        "body_bytes": ONE_MIB + 1,
        "status": status,
        "body": body,
        "from_frontend": error_code(body.encode()) is None,
        "ping_after": ping,
        "valid_prediction_after": valid_status,
    }
    result["passed"] = status == 413 and ping == 200 and valid_status == 200
    result["summary"] = (
        f"{status} for 1 MiB + 1 byte, then /ping {ping}, a prediction {valid_status}"
    )
    return result


# --- 5. restart ----------------------------------------------------------------------------


def answers_from_new_server(
    state_dir: Path, overrides: dict[str, str], texts: list[str]
) -> dict[str, Any]:
    started = time.monotonic()
    server = start(state_dir, overrides=overrides)
    try:
        ready_s = round(time.monotonic() - started, 1)
        answers = [predict(server, text)["scores"] for text in texts]
        return {"pid": server.pid(), "ready_s": ready_s, "answers": answers}
    finally:
        stop(server)


def largest_diff(first: list[dict[str, float]], second: list[dict[str, float]]) -> float | None:
    if len(first) != len(second) or any(
        set(a) != set(b) for a, b in zip(first, second, strict=True)
    ):
        return None
    return max(abs(a[k] - b[k]) for a, b in zip(first, second, strict=True) for k in a)


def restart(d: Durations) -> dict[str, Any]:
    texts = make_corpus()[:5]
    overrides = local_port_overrides()
    with tempfile.TemporaryDirectory(prefix="chaos-restart-") as state:
        first = answers_from_new_server(Path(state), overrides, texts)
        leftovers = sorted(p.name for p in (Path(state) / "tmp").iterdir())
        second: dict[str, Any] = {}
        try:
            second = answers_from_new_server(Path(state), overrides, texts)
        except (ServerError, OSError) as error:
            second = {"error": f"{type(error).__name__}: {error}", "answers": []}
    diff = largest_diff(first["answers"], second["answers"])
    result: dict[str, Any] = {
        "texts": len(texts),
        "same_state_dir_and_ports": True,
        "first": {k: v for k, v in first.items() if k != "answers"},
        "tmp_files_left_after_stop": leftovers,
        "second": {k: v for k, v in second.items() if k != "answers"},
        "second_start_blocked": "error" in second,
        "max_score_diff": diff,
    }
    result["passed"] = "error" not in second and diff is not None and diff <= RESTART_TOLERANCE
    result["summary"] = (
        f"second start {'blocked' if 'error' in second else 'ok'} "
        f"(pid {first['pid']} -> {second.get('pid')}), max score diff {diff}"
    )
    return result


# --- report --------------------------------------------------------------------------------


def run_part(
    name: str, part: Callable[[Durations], dict[str, Any]], d: Durations
) -> dict[str, Any]:
    """One part; a part that raises is a failed part, and the others still run."""
    print(f"chaos: {name} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        result = part(d)
    except Exception as error:  # reported as this part's failure
        result = {"passed": False, "error": f"{type(error).__name__}: {error}", "summary": "error"}
    result["part_seconds"] = round(time.monotonic() - started, 1)
    print(f"chaos: {name} {'passed' if result['passed'] else 'FAILED'}", file=sys.stderr)
    return result


def summary_table(report: dict[str, dict[str, Any]]) -> str:
    rows = [f"{'part':<16} {'verdict':<7} {'s':>6}  what happened"]
    for name, result in report.items():
        verdict = "pass" if result["passed"] else "FAIL"
        detail = result.get("error") or result.get("summary", "")
        rows.append(f"{name:<16} {verdict:<7} {result['part_seconds']:>6}  {detail}")
    return "\n".join(rows)
