"""Measure one server config at a few loads: the step the benchmark and the tuner repeat.

For each concurrency level: a warm-up, then a measured closed loop of the corpus, and (for
TorchServe) the batches the handler formed meanwhile, read from its log.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bert_serve.client import Client
from bert_serve.harness.batchlog import LogWindow, batch_summary
from bert_serve.harness.load import run_texts
from bert_serve.harness.server import Server, running

BATCH_KEYS = ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers")


@dataclass(frozen=True)
class Loads:
    """Concurrency levels, measured seconds per level, and the warm-up before each."""

    levels: Sequence[int]
    seconds: float
    warmup: float


def at_loads(
    name: str,
    url: str,
    headers: dict[str, str],
    corpus: Sequence[str],
    loads: Loads,
    batch_log: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """{level: load summary} for one endpoint, with the batches of ``batch_log`` if given."""
    results = {}
    for level in loads.levels:
        run_texts(url, headers, corpus, level, loads.warmup, f"{name} warm-up")
        if batch_log is None:
            results[str(level)] = run_texts(url, headers, corpus, level, loads.seconds, name)
            continue
        with LogWindow(batch_log) as window:
            result = run_texts(url, headers, corpus, level, loads.seconds, name)
            time.sleep(0.5)  # the handler logs a batch just after answering it
            results[str(level)] = result | batch_summary(window.read())
    return results


def worker_memory(server: Server) -> list[dict[str, float]]:
    """Each worker's resident memory and the part only it holds (USS), in MB."""
    out = []
    for worker in server.workers():
        info = psutil.Process(int(worker["pid"])).memory_full_info()
        out.append({"rss_mb": round(info.rss / 1e6, 1), "uss_mb": round(info.uss / 1e6, 1)})
    return out


def measure_server(
    name: str, server: Server, corpus: Sequence[str], loads: Loads
) -> dict[str, Any]:
    """The batch settings TorchServe applied, each worker's memory after a first request, and
    the server at each load."""
    model = server.model()
    run_texts(server.predict_url, server.headers(), corpus[:8], 1, 0.5, f"{name} first request")
    return {
        "config": {key: model[key] for key in BATCH_KEYS},
        "worker_memory": worker_memory(server),
        "by_concurrency": at_loads(
            name, server.predict_url, server.headers(), corpus, loads, server.model_log
        ),
    }


def measure_config(
    name: str,
    overrides: dict[str, str],
    corpus: Sequence[str],
    loads: Loads,
    then: Callable[[Server], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``measure_server`` on a server of its own started with ``overrides``; ``then`` runs on
    the same server afterwards and adds its keys to the result."""
    prefix = "measure-" + re.sub(r"\W+", "-", name) + "-"
    started = time.monotonic()
    with running(overrides, prefix=prefix) as server:
        startup_s = round(time.monotonic() - started, 1)
        result = {"startup_s": startup_s} | measure_server(name, server, corpus, loads)
        return result | (then(server) if then else {})


def process_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def frontend_cost(
    name: str, overrides: dict[str, str], corpus: Sequence[str], level: int, loads: Loads
) -> dict[str, Any]:
    """Requests/s at ``level`` clients, and what each request cost TorchServe's frontend (the
    Java process: HTTP, batching, logging) in CPU time and in log bytes written."""
    prefix = "frontend-" + re.sub(r"\W+", "-", name) + "-"
    with running(overrides, prefix=prefix) as server:
        pid = server.pid()
        if pid is None:
            raise RuntimeError(f"{name}: the frontend is not running")
        logs = server.state_dir / "logs"
        run_texts(
            server.predict_url, server.headers(), corpus, level, loads.warmup, f"{name} warm-up"
        )
        cpu_before = process_cpu_s(pid)
        bytes_before = sum(item.stat().st_size for item in logs.iterdir() if item.is_file())
        result = run_texts(server.predict_url, server.headers(), corpus, level, loads.seconds, name)
        cpu_ms = (process_cpu_s(pid) - cpu_before) * 1000
        written = (
            sum(item.stat().st_size for item in logs.iterdir() if item.is_file()) - bytes_before
        )
        requests = max(result["requests"], 1)
        return {
            "rps": result["rps"],
            "p50_ms": result["p50_ms"],
            "errors": result["errors"],
            "frontend_cpu_ms_per_request": round(cpu_ms / requests, 3),
            "log_bytes_per_request": round(written / requests),
        }


def client_lists(
    server: Server, texts: Sequence[str], chunk_size: int, concurrency: int
) -> dict[str, Any]:
    """Texts/s of the Python client's ``classify_many`` (list requests) over ``texts``, after
    a warm-up of one round of chunks."""
    client = Client(server.inference_url, token=server.key("inference"))
    options = {"chunk_size": chunk_size, "concurrency": concurrency}
    client.classify_many(list(texts[: chunk_size * concurrency]), **options)
    start = time.perf_counter()
    results = client.classify_many(texts, **options)
    elapsed = time.perf_counter() - start
    return options | {
        "texts": len(texts),
        "seconds": round(elapsed, 2),
        "texts_per_s": round(len(texts) / elapsed, 1),
        "errors": sum(not result.ok for result in results),
    }
