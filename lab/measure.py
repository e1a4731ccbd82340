"""Measure one server config at a few loads: the step the benchmark and the tuner repeat.

For each concurrency level: a warm-up, then a measured closed loop of the corpus, and (for
TorchServe) the batches the handler formed meanwhile, read from its log.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from bert_serve_server.archive import BATCH_KEYS
from bert_serve_server.control import Server, running

from bert_serve.client import Client
from lab.batchlog import LogWindow, batch_summary
from lab.load import run_texts


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


def worker_memory(server: Server) -> list[dict[str, float | None]]:
    """Each worker's resident memory and the part only it holds (USS), in MB."""
    return [
        {"rss_mb": worker.rss_mb, "uss_mb": worker.uss_mb}
        for worker in server.memory().workers.values()
    ]


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


def server_processes(server: Server) -> dict[str, int]:
    """The pids of the frontend, of each worker and of this process (the load generator, which
    shares the machine)."""
    pids = {"load_generator": os.getpid()}
    frontend = server.pid()
    if frontend is not None:
        pids["frontend"] = frontend
    return pids | {f"worker_{n}": worker.pid for n, worker in enumerate(server.workers())}


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


def cpu_split(server: Server, corpus: Sequence[str], level: int, loads: Loads) -> dict[str, Any]:
    """Where the CPU goes while ``server`` answers ``level`` clients: cores used by the
    frontend, by each worker and by this load generator (it shares the machine)."""
    url, headers = server.predict_url, server.headers()
    run_texts(url, headers, corpus, level, loads.warmup, "cpu split warm-up")
    with cores_used(server_processes(server)) as cores:
        result = run_texts(url, headers, corpus, level, loads.seconds, "cpu split")
    return {
        "concurrency": level,
        "rps": result["rps"],
        "cores": cores,
        "cores_total": round(sum(cores.values()), 3),
        "machine_cores": psutil.cpu_count(),
    }


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
        one_level = Loads([level], loads.seconds, loads.warmup)
        for item in endpoints:
            with its_turn(item, endpoints):
                measured = at_loads(
                    item.name, item.url, item.headers, corpus, one_level, item.batch_log
                )
            results[item.name] |= measured
    return results


@contextmanager
def its_turn(current: Endpoint, endpoints: Sequence[Endpoint]) -> Iterator[None]:
    """Every other endpoint that asks for it is paused while ``current`` is measured."""
    paused = [
        item.paused_between_turns
        for item in endpoints
        if item is not current and item.paused_between_turns is not None
    ]
    for group in paused:
        os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        for group in paused:
            os.killpg(group, signal.SIGCONT)


@contextmanager
def servers(
    configs: Mapping[str, dict[str, str]], envs: Mapping[str, Mapping[str, str]] | None = None
) -> Iterator[dict[str, dict[str, Any]]]:
    """One TorchServe per named config, started one after another (each one's start-up time
    measured alone), all running until the block ends, then all stopped. Yields {name:
    {"server", "startup_s", "config", "worker_memory"}}, memory taken after a first request.
    ``envs``: environment variables by name, for the servers that need their own."""
    with ExitStack() as stack:
        started: dict[str, dict[str, Any]] = {}
        for name, overrides in configs.items():
            prefix = "measure-" + re.sub(r"\W+", "-", name) + "-"
            began = time.monotonic()
            env = (envs or {}).get(name)
            server = stack.enter_context(running(overrides, prefix=prefix, env=env))
            startup_s = round(time.monotonic() - began, 1)
            model = server.model()
            run_texts(server.predict_url, server.headers(), ["warm"], 1, 0.3, f"{name} first")
            started[name] = {
                "server": server,
                "startup_s": startup_s,
                "config": {key: model[key] for key in BATCH_KEYS},
                "worker_memory": worker_memory(server),
            }
        yield started


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


def env_assignments(items: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` arguments (environment variables or config.properties keys) as a
    mapping; anything else is a usage error."""
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (name, sign, _) in zip(items, pairs, strict=True) if not name or not sign]
    if bad:
        raise SystemExit(f"settings must be NAME=VALUE, got {bad}")
    return {name: value for name, _, value in pairs}
