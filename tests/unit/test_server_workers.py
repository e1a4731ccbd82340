"""A server's workers, with no TorchServe: a stub management API lists them, and this test
process stands in for the frontend (its children are the "workers")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from bert_serve_server import control as server_module
from bert_serve_server.control import Server, ServerError

from tests.stub_http import stub_server


class Listing:
    """What the stub management API answers next: a list of (id, pid, status) per call, the
    last one repeated; an empty list of lists makes it answer 500."""

    def __init__(self) -> None:
        self.answers: list[list[tuple[str, int, str]]] = []
        self.lock = threading.Lock()

    def next(self) -> list[tuple[str, int, str]] | None:
        with self.lock:
            if not self.answers:
                return None
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def listing() -> Listing:
    return Listing()


@pytest.fixture
def server(tmp_path: Path, listing: Listing, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """This test process stands in for the frontend: its pid is in the pid file, and taken
    for TorchServe's (the real check reads /proc/<pid>/cmdline: test_sizing_stated.py)."""
    monkeypatch.setattr(server_module, "is_frontend", lambda pid: pid == os.getpid())

    def management(path: str, client_port: int) -> tuple[int, bytes]:
        workers = listing.next()
        if workers is None:
            return 500, b""
        model = {"workers": [{"id": i, "pid": p, "status": s} for i, p, s in workers]}
        return 200, json.dumps([model]).encode()

    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / ".model_server.pid").write_text(str(os.getpid()))
    with stub_server(management) as url:
        models = json.dumps({"bert": {"1.0": {}}})
        yield Server(
            tmp_path, {"management_address": url, "inference_address": url, "models": models}
        )


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait(10)


def test_workers_are_listed_and_an_unanswering_api_lists_none(
    server: Server, listing: Listing
) -> None:
    assert server.workers() == [] and not server.workers_ready()
    listing.answers = [[("9000", 11, "READY"), ("9001", 12, "UNLOADING")]]
    assert [(w.id, w.pid, w.ready) for w in server.workers()] == [
        ("9000", 11, True),
        ("9001", 12, False),
    ]
    assert server.worker_pid() == 11 and not server.workers_ready()


def test_only_a_process_the_frontend_started_is_killed(
    server: Server, child: subprocess.Popen[bytes]
) -> None:
    with pytest.raises(ServerError, match="not a worker"):
        server.kill_worker(1)
    server.kill_worker(child.pid)
    assert child.wait(10) == -signal.SIGKILL


def test_wait_replaced_waits_for_every_worker_ready_without_the_killed_one(
    server: Server, listing: Listing
) -> None:
    listing.answers = [
        [("9000", 11, "READY")],  # the killed worker still listed
        [("9000", 21, "STARTING"), ("9001", 12, "READY")],
        [("9000", 21, "READY"), ("9001", 12, "READY")],
    ]
    new_pid, waited = server.wait_replaced(11, {11, 12}, timeout=10)
    assert new_pid == 21 and 0 < waited < 10
    listing.answers = [[("9000", 11, "READY"), ("9001", 12, "READY")]]
    with pytest.raises(TimeoutError, match="worker 11 not replaced"):
        server.wait_replaced(11, {11, 12}, timeout=0.3)


def test_memory_is_in_mb_per_worker_id(
    server: Server, listing: Listing, child: subprocess.Popen[bytes]
) -> None:
    listing.answers = [[("9000", child.pid, "READY"), ("9001", 2**22 + 1, "READY")]]
    memory = server.memory()
    ours = memory.workers["9000"]
    assert memory.frontend_rss_mb is not None and memory.frontend_rss_mb > 10  # this pytest
    assert ours.pid == child.pid and 0 < (ours.uss_mb or 0) <= (ours.rss_mb or 0) < 100
    assert memory.workers["9001"].rss_mb is None  # no such process
    assert memory.workers_rss_mb == ours.rss_mb


def test_a_servers_own_environment_wins_over_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The A/B of an environment setting: one server gets its own value, its state folder
    still decides where temporary files and logs go."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env = Server(
        tmp_path, {}, env={"OMP_WAIT_POLICY": "PASSIVE", "TMPDIR": "/elsewhere"}
    ).environment()
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["TMPDIR"] == str(tmp_path / "tmp")


def test_a_frontend_that_exits_during_start_is_started_again_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port picked free can be taken before TorchServe binds it (CI saw "TorchServe exited
    during start"): the start tries again on new ports, and says why when it gives up."""
    tried: list[str] = []

    def start(state_dir: Path, overrides: dict[str, str], **_: object) -> Server:
        tried.append(overrides["inference_address"])
        if len(tried) < server_module.START_ATTEMPTS:
            raise server_module.FrontendExited("exited during start")
        return Server(state_dir, overrides)

    monkeypatch.setattr(server_module, "start", start)
    started = server_module.start_on_free_ports(tmp_path, {})
    assert len(set(tried)) == server_module.START_ATTEMPTS
    assert started.properties["inference_address"] == tried[-1]

    def never_starts(state_dir: Path, overrides: dict[str, str], **_: object) -> Server:
        raise server_module.FrontendExited("exited during start")

    monkeypatch.setattr(server_module, "start", never_starts)
    with pytest.raises(server_module.FrontendExited):
        server_module.start_on_free_ports(tmp_path, {})


def test_no_two_listeners_of_a_start_share_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drawing that gives one port to two listeners is drawn again."""
    draws = iter(
        [
            {
                "inference_address": "http://127.0.0.1:4000",
                "management_address": "http://127.0.0.1:4000",
            },
            {"inference_address": "http://127.0.0.1:4000", "grpc_inference_port": "4000"},
            {"inference_address": "http://127.0.0.1:4000", "grpc_inference_port": "4001"},
        ]
    )
    monkeypatch.setattr(server_module, "local_port_overrides", lambda: next(draws))
    assert server_module.distinct_local_ports()["grpc_inference_port"] == "4001"


def test_the_log_tail_names_the_frontends_last_words(tmp_path: Path) -> None:
    from bert_serve_server.control import log_tail

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "console.log").write_text("Model server started.\n")
    (logs / "ts_log.log").write_text("java.net.BindException: Address already in use\n")
    tail = log_tail(Server(tmp_path, {}))
    assert "Model server started." in tail and "BindException" in tail
    assert log_tail(Server(tmp_path / "none", {})) == "(no log lines)"


def test_the_workers_get_their_threads_tokenizer_threads_and_precisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the sizing chose reaches the frontend and so its workers: the torch threads, the
    tokenizer's pool at the same share, and each ``auto`` model's precision."""
    from bert_serve_server import sizing

    entry = {"bert": {"1.0": {"marName": "bert.mar", "precision": "bf16"}}}
    resolved = sizing.Resolved({"models": json.dumps(entry)}, torch_threads=3, reasons=())
    monkeypatch.setattr(sizing, "resolve", lambda source, stated: resolved)
    launched: list[Server] = []
    monkeypatch.setattr(server_module, "launch", launched.append)
    for name in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    server_module.launch_sized(tmp_path, {}, None)
    (server,) = launched
    assert dict(server.env) == {
        "OMP_NUM_THREADS": "3",
        "RAYON_NUM_THREADS": "3",
        "BERT_SERVE_PRECISION_CHOSEN": "bert:1.0=bf16",
    }
