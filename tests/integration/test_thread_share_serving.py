"""Lent threads on a real torchserve: a worker that ends while idle lends nothing more.

Two workers of one torch thread each (config/config.properties' default) serve the tiny
BERT, packaged into a model store of their own. Each batch's log line names its worker
(``W-<id>``) and ``threads=``, the most threads a forward pass of it ran with. While a
SIGKILLed idle worker is replaced, and after a scale-down to one worker, the workers own one
core between them: the surviving worker's batches must run on one thread. (Before the fix
they ran on two: the dead worker's slot record still said idle.)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from harness.archive import package_variant
from harness.batchlog import LogWindow
from harness.config import models_entry
from harness.server import Server, running, wait_ready

BATCH_LINE = re.compile(r" (W-\d+)-\S+ .*batch_size=\d+ .* threads=(\d+)")
TEXT = "The service was slow but the food made up for it."
LIMIT_S = 120.0


@pytest.fixture(scope="module")
def two_workers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("thread-share-serving")
    # The tiny model's passes are far below the default borrow_from_ms: lend for every pass.
    package_variant(root / "store", handler_changes={"borrow_from_ms": 0}, model_dir=tiny_model_dir)
    overrides = {"model_store": str(root / "store"), "models": models_entry(workers=2)}
    with running(overrides, state_dir=root / "state") as server:
        yield server


def send(server: Server, timeout: float = 30) -> int | None:
    """One request; its status, or None when it got no answer (it met a dying worker)."""
    headers = server.headers() | {"Content-Type": "text/plain"}
    try:
        return requests.post(
            server.predict_url, data=TEXT.encode(), headers=headers, timeout=timeout
        ).status_code
    except requests.RequestException:
        return None


def batches(window: LogWindow, at_least: int) -> list[tuple[str, int]]:
    """(worker, threads) of each batch logged in the window, once ``at_least`` have landed
    (the frontend copies the workers' output a moment after their answers)."""
    deadline = time.monotonic() + 30
    while True:
        found = [(m[1], int(m[2])) for m in BATCH_LINE.finditer(window.read())]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def settle(server: Server) -> None:
    """Until the workers' log stops growing for 0.5 s: the lines of what was sent so far
    have all landed, so none of them is read as the next step's."""
    deadline = time.monotonic() + 30
    size = -1
    while size != server.model_log.stat().st_size and time.monotonic() < deadline:
        size = server.model_log.stat().st_size
        time.sleep(0.5)


def pids_by_worker(server: Server) -> dict[str, int]:
    """READY workers by their log name (``W-9000``)."""
    return {f"W-{worker.id}": worker.pid for worker in server.workers() if worker.ready}


def ended(pid: int) -> bool:
    """Every thread of it has exited: its files, and so its locks, are closed. (The main
    thread of a SIGKILLed worker is a zombie at once while its other threads still close
    its files, about 0.1 s here; a worker stopped by a scale-down runs about 0.3 s more
    after the API lists it no more. Meanwhile it holds its lock, idle.)"""
    tasks = Path(f"/proc/{pid}/task")
    try:
        states = [
            (task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()
        ]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return not tasks.exists()
    return all(state in ("Z", "X") for state in states)


def until(condition: Callable[[], bool], what: str, each: Callable[[], object]) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {LIMIT_S:.0f} s")
        each()


def both_ran_a_batch_and_idle(server: Server) -> dict[str, int]:
    """Bursts until each worker has run a batch (a worker lends only after its first)."""
    wait_ready(server, LIMIT_S)
    workers = pids_by_worker(server)
    assert len(workers) == 2
    seen: set[str] = set()
    with LogWindow(server.model_log) as window, ThreadPoolExecutor(8) as pool:

        def burst() -> None:
            list(pool.map(lambda _: send(server), range(8)))
            seen.update(worker for worker, _ in batches(window, 1))

        until(lambda: seen >= set(workers), "a batch on each worker", burst)
    settle(server)
    return workers


def threads_of_a_lone_request(server: Server) -> int:
    with LogWindow(server.model_log) as window:
        assert send(server) == 200
        batches(window, 1)
        settle(server)
        ((_, threads),) = batches(window, 1)
    return threads


def test_a_worker_killed_while_idle_lends_nothing_while_it_is_replaced(
    two_workers: Server,
) -> None:
    server = two_workers
    workers = both_ran_a_batch_and_idle(server)
    assert threads_of_a_lone_request(server) == 2, "idle workers should lend here"
    killed, survivor = sorted(workers)
    with LogWindow(server.model_log) as window:
        server.kill_worker(workers[killed])
        until(lambda: ended(workers[killed]), "the killed worker's exit", lambda: None)
        answered = 0

        def replaced() -> bool:
            ready = pids_by_worker(server)
            return len(ready) == 2 and workers[killed] not in ready.values()

        def one_more() -> None:
            nonlocal answered
            answered += send(server, timeout=10) == 200

        until(replaced, "the killed worker's replacement", one_more)
        batches(window, answered)
        settle(server)
        survivors = [t for worker, t in batches(window, answered) if worker == survivor]
    assert survivors, "no batch ran on the surviving worker while the other was replaced"
    assert max(survivors) == 1, (
        f"the surviving worker ran {survivors} threads while it owned 1: "
        "it borrowed the dead worker's"
    )


def test_after_a_scale_down_the_remaining_worker_runs_on_its_own_threads(
    two_workers: Server,
) -> None:
    server = two_workers
    workers = both_ran_a_batch_and_idle(server)
    assert threads_of_a_lone_request(server) == 2, "idle workers should lend here"
    response = requests.put(
        f"{server.management_url}/models/bert",
        params={"min_worker": 1, "max_worker": 1, "synchronous": "true"},
        headers=server.headers("management"),
        timeout=LIMIT_S,
    )
    assert response.status_code == 200, response.text
    until(lambda: len(server.workers()) == 1, "the scale-down", lambda: time.sleep(0.5))
    (removed,) = set(workers.values()) - set(pids_by_worker(server).values())
    until(lambda: ended(removed), "the removed worker's exit", lambda: time.sleep(0.1))
    with LogWindow(server.model_log) as window, ThreadPoolExecutor(8) as pool:
        statuses = [send(server) for _ in range(10)]
        statuses += list(pool.map(lambda _: send(server), range(16)))
        batches(window, 11)
        settle(server)
        found = batches(window, 11)
    assert statuses == [200] * 26
    assert found and max(threads for _, threads in found) == 1, (
        f"threads after the scale-down: {[t for _, t in found]}; the one worker owns 1"
    )
