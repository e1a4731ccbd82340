"""A crash shows on the server's stdout (the container's log: `kubectl logs`, `podman logs`),
with config/log4j2.xml and config.properties' vmargs as shipped: a model that fails to load
leaves its Python traceback there, the lines per batch do not, and the access log joins when
asked (BERT_SERVE_ACCESS_LOG_STDOUT). A real TorchServe with an archive whose handler raises in
``initialize``, no sizing (it would refuse the archive): about 20 s."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from bert_serve_server.config import (
    BASE_CONFIG,
    ROOT,
    free_port,
    properties_text,
    read_properties,
    with_log_config,
)
from bert_serve_server.control import torchserve_command

BROKEN_HANDLER = """
class Broken:
    def initialize(self, context):
        raise RuntimeError("bert-serve crash test: the weights are missing")

    def handle(self, data, context):
        return ["never"]
"""


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """(its state folder, its inference address) of a TorchServe whose one model cannot load,
    its stdout in ``stdout.log``; stopped after the module."""
    state = tmp_path_factory.mktemp("crash")
    store = state / "store"
    store.mkdir()
    (state / "broken.py").write_text(BROKEN_HANDLER)
    subprocess.run(
        [
            str(Path(torchserve_command()).with_name("torch-model-archiver")),
            "--model-name",
            "broken",
            "--version",
            "1.0",
            "--handler",
            str(state / "broken.py"),
            "--export-path",
            str(store),
        ],
        check=True,
        timeout=120,
    )
    base = read_properties(BASE_CONFIG)
    assert "-XX:+ExitOnOutOfMemoryError" in base["vmargs"].split()
    inference = f"http://127.0.0.1:{free_port()}"
    properties = base | {
        "inference_address": inference,
        "management_address": f"http://127.0.0.1:{free_port()}",
        "metrics_address": f"http://127.0.0.1:{free_port()}",
        "grpc_inference_port": str(free_port()),
        "grpc_management_port": str(free_port()),
        "model_store": str(store),
        "load_models": "broken.mar",
        "models": '{"broken": {"1.0": {"marName": "broken.mar", "minWorkers": 1, "maxWorkers": 1}}}',
        "metrics_config": str(ROOT / "config" / "metrics.yaml"),
        "vmargs": with_log_config(base["vmargs"], lambda path: ROOT / path),
        "disable_token_authorization": "true",
    }
    (state / "config.properties").write_text(properties_text(properties))
    (state / "tmp").mkdir()
    env = os.environ | {
        "TMPDIR": str(state / "tmp"),
        "TEMP": str(state / "tmp"),
        "LOG_LOCATION": str(state / "logs"),
        "METRICS_LOCATION": str(state / "logs"),
        "BERT_SERVE_ACCESS_LOG_STDOUT": "info",
    }
    with (state / "stdout.log").open("wb") as stdout:
        launcher = subprocess.Popen(
            [torchserve_command(), "--foreground", "--ncs", "--ts-config", "config.properties"],
            cwd=state,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
        )
    try:
        listening(inference, launcher)
        yield state, inference
    finally:
        subprocess.run(
            [torchserve_command(), "--stop", "--foreground"],
            cwd=state,
            env=env,
            capture_output=True,
            timeout=90,
        )
        launcher.wait(timeout=30)


def listening(address: str, launcher: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    """Until the frontend accepts connections on ``address``: a TCP connect, no request (the
    access log must hold only the tests' own). Each test may then run first (any order)."""
    host, port = address.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            return
        except OSError:
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_for(path: Path, text: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = path.read_text(errors="replace") if path.is_file() else ""
        if text in found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path} after {timeout_s} s:\n{found[-3000:]}")


def test_a_model_that_fails_to_load_leaves_its_traceback_on_stdout(
    crashed: tuple[Path, str],
) -> None:
    state, _ = crashed
    out = wait_for(state / "stdout.log", "bert-serve crash test: the weights are missing")
    assert "Traceback (most recent call last)" in out
    assert "MODEL_LOG" in out and "in initialize" in out


def test_the_access_log_joins_stdout_when_asked(crashed: tuple[Path, str]) -> None:
    state, inference = crashed
    requests.get(f"{inference}/ping", timeout=10)
    out = wait_for(state / "stdout.log", "ACCESS_LOG")
    assert '"GET /ping HTTP/1.1"' in out
