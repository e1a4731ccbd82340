"""Overload: ``job_queue_size=8`` and a burst of 400 requests on 200 connections. The excess
must get 503s (the frontend's queue bound); the handler may also answer 504
``deadline_exceeded`` (while the frontend refuses, it holds a request to its budget end to
end: docs/deadlines.md); nothing may get another 5xx, and /ping must still answer. Also
reports latencies by status and the frontend's and workers' RSS (MB) before and after."""

from __future__ import annotations

from typing import Any

from bert_serve_server.control import Server, running

from lab.chaos.common import Durations, closed_loop, latency, ping_status, predict
from lab.corpus import make_corpus
from lab.load import json_job, statuses

QUEUE_SIZE = 8


def memory(server: Server) -> dict[str, Any]:
    """RSS of the frontend and of every worker (by pid), in MB."""
    now = server.memory()
    return {
        "frontend_rss_mb": now.frontend_rss_mb,
        "worker_rss_mb": {str(worker.pid): worker.rss_mb for worker in now.workers.values()},
        "workers_total_rss_mb": now.workers_rss_mb,
    }


def run(d: Durations) -> dict[str, Any]:
    corpus = make_corpus()
    with running({"job_queue_size": str(QUEUE_SIZE)}) as server:
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
    other_5xx = {s: n for s, n in counts.items() if s.startswith("5") and s not in ("503", "504")}
    result: dict[str, Any] = {
        "job_queue_size": QUEUE_SIZE,
        "requests": load.sent,
        "concurrency": d.overload_concurrency,
        "statuses": counts,
        "latency_503": latency(rejected),
        "latency_200": latency([o for o in load.outcomes if o.status == "200"]),
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
