"""`make serve` keeps a running server only while what its start read is unchanged: the config,
the .mar and the `BERT_SERVE_*` variables a start takes as stated (`control.start_or_reuse`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from bert_serve_server import control
from bert_serve_server.config import properties_text

VARIABLES = (*control.START_VARIABLES, control.THREADS_ENV)


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A state folder whose frontend is this test process (the pid check is stubbed, and stop
    and start only recorded), started with `environment` recorded, its .mar older than it."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(control, "is_frontend", lambda pid: pid == os.getpid())
    store = tmp_path / "store"
    store.mkdir()
    (store / "bert.mar").write_bytes(b"mar")
    os.utime(store / "bert.mar", (1, 1))
    source = {
        "inference_address": "http://127.0.0.1:8080",
        "management_address": "http://127.0.0.1:8081",
        "model_store": str(store),
        "load_models": "bert.mar",
    }
    state = tmp_path / "state"
    (state / "tmp").mkdir(parents=True)
    (state / "config.properties").write_text(properties_text(source))
    (state / "tmp" / ".model_server.pid").write_text(str(os.getpid()))
    calls: dict[str, Any] = {"stopped": 0, "started": 0, "state": state}

    def record(environment: dict[str, str]) -> None:
        sizing = {"source": source, "in_force": {}, "environment": environment}
        (state / "sizing.json").write_text(json.dumps(sizing))

    def stop(server: control.Server, timeout: float | None = None) -> None:
        calls["stopped"] += 1

    def start(state_dir: Path, overrides: dict[str, str] | None = None) -> str:
        calls["started"] += 1
        return "restarted"

    monkeypatch.setattr(control, "effective_properties", lambda overrides=None: dict(source))
    monkeypatch.setattr(control, "stop", stop)
    monkeypatch.setattr(control, "start", start)
    calls["record"] = record
    return calls


def test_an_unchanged_start_keeps_the_server(
    running: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    running["record"]({})
    server = control.start_or_reuse(running["state"])
    assert server != "restarted" and running["stopped"] == 0
    assert "BERT_SERVE_* variables unchanged" in capsys.readouterr().out


def test_a_stated_variable_set_since_the_start_restarts_it(
    running: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make serve` then `BERT_SERVE_WORKERS=2 make serve` said "unchanged" and kept 1 worker."""
    running["record"]({})
    monkeypatch.setenv("BERT_SERVE_WORKERS", "2")
    assert control.start_or_reuse(running["state"]) == "restarted"
    assert (running["stopped"], running["started"]) == (1, 1)
    assert "BERT_SERVE_WORKERS (unset -> 2) changed since TorchServe started: restarting" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("before", "now"),
    [
        ({"BERT_SERVE_BATCH_SIZE": "8"}, {"BERT_SERVE_BATCH_SIZE": "16"}),
        ({"BERT_SERVE_HEAP": "2g"}, {}),
        ({}, {"OMP_NUM_THREADS": "1"}),
        ({}, {"BERT_SERVE_MODEL_LOG_STDOUT": "off"}),
    ],
)
def test_a_changed_or_unset_variable_restarts_it(
    running: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    before: dict[str, str],
    now: dict[str, str],
) -> None:
    running["record"](before)
    for name, value in now.items():
        monkeypatch.setenv(name, value)
    assert control.start_or_reuse(running["state"]) == "restarted"


def test_variables_the_start_does_not_read_change_nothing(
    running: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    running["record"]({"BERT_SERVE_WORKERS": "2"})
    monkeypatch.setenv("BERT_SERVE_WORKERS", " 2 ")
    for name in ("BERT_SERVE_STOP_S", "BERT_SERVE_TOKEN", "BERT_SERVE_URL", "BERT_SERVE_QUEUE"):
        monkeypatch.setenv(name, "7" if name == "BERT_SERVE_STOP_S" else "")
    assert control.start_or_reuse(running["state"]) != "restarted"
    assert running["stopped"] == 0


def test_a_plan_file_edited_in_place_restarts_it(
    running: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """BERT_SERVE_PLAN names a file: its content is what is stated, so its digest is recorded."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"workers": 1}')
    monkeypatch.setenv("BERT_SERVE_PLAN", str(plan))
    running["record"](control.start_environment())
    assert control.start_or_reuse(running["state"]) != "restarted"
    plan.write_text('{"workers": 2}')
    assert control.start_or_reuse(running["state"]) == "restarted"


def test_the_start_records_what_it_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BERT_SERVE_CORES", "2")
    monkeypatch.setenv("BERT_SERVE_QUEUE", "")
    monkeypatch.setenv("BERT_SERVE_STOP_S", "9")
    assert control.start_environment() == {"BERT_SERVE_CORES": "2"}
    monkeypatch.setenv("BERT_SERVE_PLAN", "/nonexistent/plan.json")
    recorded = control.start_environment()
    assert recorded["BERT_SERVE_PLAN sha256"].startswith("unreadable")
