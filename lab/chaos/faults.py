"""The short chaos parts, one function each: malformed requests in a soak, a burst over the
queue's bound, an oversized body, a restart in the same state folder."""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests
from bert_serve_server.config import local_port_overrides
from bert_serve_server.control import Server, ServerError, running

from lab.batchlog import LogWindow, batch_summary
from lab.chaos import (
    FORM,
    MALFORMED,
    REQUEST_TIMEOUT_S,
    Durations,
    closed_loop,
    error_code,
    latency,
    part_server,
    ping_status,
    predict,
)
from lab.corpus import make_corpus
from lab.load import Job, Outcome, in_turn, json_job, statuses

SCORE_TOLERANCE = 1e-4
RESTART_TOLERANCE = 1e-6
QUEUE_SIZE = 8
OVERLOAD_REQUESTS, OVERLOAD_CLIENTS = 400, 200
ONE_MIB = 1024 * 1024


def valid_jobs(text: str) -> list[Job]:
    """The same text as JSON, as a raw text/plain body and as a urlencoded form field."""
    return [
        json_job(text),
        Job(text.encode(), "text/plain", expected=text),
        Job(urlencode({"text": text}).encode(), FORM, expected=text),
    ]


def soak_job(index: int, valid: list[Job]) -> Job:
    """Every 10th request is malformed, cycling through every kind; the rest cycle the valid."""
    if index % 10 == 9:
        return MALFORMED[(index // 10) % len(MALFORMED)]
    return valid[(index // 10 * 9 + index % 10) % len(valid)]


def score_diff(body: bytes, reference: dict[str, float]) -> float | None:
    """Largest score difference to ``reference``; None if the body is not such a prediction."""
    try:
        scores = json.loads(body)["scores"]
        if set(scores) != set(reference):
            return None
        return max(abs(float(scores[label]) - value) for label, value in reference.items())
    except (ValueError, KeyError, TypeError):
        return None


def valid_verdict(outcome: Outcome, alone: dict[str, dict[str, float]]) -> tuple[str, float]:
    """("ok" | "failed" | "changed", score difference) of one valid request."""
    diff = score_diff(outcome.body, alone[outcome.job.expected])
    if outcome.status != "200" or diff is None:
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
    """A concurrency-16 closed loop for --seconds, about 10 % of it malformed (every kind the
    validator knows, in turn). Every valid answer must be 200 with the scores its text gets when
    sent alone (within 1e-4), every malformed one its own 4xx and code."""
    texts = make_corpus()[:20]
    valid = [job for text in texts for job in valid_jobs(text)]
    with part_server(d) as server:
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


def memory(server: Server) -> dict[str, Any]:
    """RSS of the frontend and of every worker (by pid), in MB."""
    now = server.memory()
    return {
        "frontend_rss_mb": now.frontend_rss_mb,
        "worker_rss_mb": {str(worker.pid): worker.rss_mb for worker in now.workers.values()},
        "workers_total_rss_mb": now.workers_rss_mb,
    }


def overload(d: Durations) -> dict[str, Any]:
    """``job_queue_size=8`` and a burst of 400 requests on 200 connections. The excess must get
    503s (the frontend's queue bound); the handler may also answer 504 ``deadline_exceeded``
    (while the frontend refuses, it holds a request to its budget end to end:
    docs/deadlines.md); nothing may get another 5xx, and /ping must still answer. Also reports
    latencies by status and the frontend's and workers' RSS (MB) before and after."""
    corpus = make_corpus()
    with running({"job_queue_size": str(QUEUE_SIZE)}) as server:
        for text in corpus[:3]:
            predict(server, text)
        before = memory(server)
        count = OVERLOAD_REQUESTS
        load = closed_loop(server, in_turn(corpus), OVERLOAD_CLIENTS, 120, max_requests=count)
        load.run()
        after = memory(server)
        ping = ping_status(server)
    rejected = [o for o in load.outcomes if o.status == "503"]
    counts = statuses(load.outcomes)
    other_5xx = {s: n for s, n in counts.items() if s.startswith("5") and s not in ("503", "504")}
    result: dict[str, Any] = {
        "job_queue_size": QUEUE_SIZE,
        "requests": load.sent,
        "concurrency": OVERLOAD_CLIENTS,
        "statuses": counts,
        "latency_503": latency([o.ms for o in rejected]),
        "latency_200": latency([o.ms for o in load.outcomes if o.status == "200"]),
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
    """A body of 1 MiB + 1 byte gets the frontend's 413; then /ping and a valid prediction still
    answer 200."""
    with part_server(d) as server:
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


def answers_from_new_server(
    state_dir: Path, overrides: dict[str, str], texts: list[str]
) -> dict[str, Any]:
    started = time.monotonic()
    with running(overrides, state_dir=state_dir) as server:
        ready_s = round(time.monotonic() - started, 1)
        answers = [predict(server, text)["scores"] for text in texts]
        return {"pid": server.pid(), "ready_s": ready_s, "answers": answers}


def largest_diff(first: list[dict[str, float]], second: list[dict[str, float]]) -> float | None:
    pairs = list(zip(first, second, strict=False))
    if len(first) != len(second) or any(set(a) != set(b) for a, b in pairs):
        return None
    return max(abs(a[k] - b[k]) for a, b in pairs for k in a)


def restart(d: Durations) -> dict[str, Any]:
    """Answers for 5 texts, stop, a second server in the same state folder (same ports) starts
    without any cleanup and gives the same answers (within 1e-6)."""
    texts = make_corpus()[:5]
    overrides = local_port_overrides()
    with tempfile.TemporaryDirectory(prefix="chaos-restart-") as state:
        first = answers_from_new_server(Path(state), overrides, texts)
        leftovers = sorted(p.name for p in (Path(state) / "tmp").iterdir())
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
