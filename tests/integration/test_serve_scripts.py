"""What `make serve` relies on: an idempotent start, and a clear failure without Java."""

from __future__ import annotations

import os
import shutil
import subprocess

from bert_serve_server.config import local_port_overrides
from bert_serve_server.control import server_for, start, start_or_reuse, stop

from tests.conftest import MAR_PATH, ROOT
from tests.integration.conftest import stated_settings


def test_second_start_reuses_the_server_and_a_new_mar_restarts_it(tmp_path, monkeypatch) -> None:
    """start_or_reuse keeps a running server, and restarts it when the .mar, the config or a
    BERT_SERVE_* variable the start reads changed.

    It serves a copy of the archive in a store of its own (touching the shared one would make
    every later start of the run measure it again), with its settings stated."""
    store = tmp_path / "store"
    store.mkdir()
    archive = store / MAR_PATH.name
    shutil.copy2(MAR_PATH, archive)
    overrides = local_port_overrides() | {"model_store": str(store)} | stated_settings()
    state = tmp_path / "state"
    server = start(state, overrides=overrides)
    try:
        first_pid = server.pid()
        again = start_or_reuse(state, overrides)
        assert again.pid() == first_pid
        os.utime(archive)
        restarted = start_or_reuse(state, overrides)
        assert restarted.pid() not in (None, first_pid)
        assert restarted.inference_url == server.inference_url
        previous_pid = restarted.pid()
        changed = start_or_reuse(state, overrides | {"job_queue_size": "50"})
        assert changed.pid() not in (None, previous_pid)
        assert changed.properties["job_queue_size"] == "50"
        changed_pid = changed.pid()  # pid() reads the pid file, which a restart rewrites
        monkeypatch.setenv("BERT_SERVE_QUEUE", "60")  # a stated variable wins over the config
        stated = start_or_reuse(state, overrides | {"job_queue_size": "50"})
        assert stated.pid() not in (None, changed_pid)
        assert server_for(state).properties["job_queue_size"] == "60"
    finally:
        stop(server_for(state))
    assert server_for(state).pid() is None


def test_missing_java_fails_fast_with_the_fix() -> None:
    """scripts/check_java.sh, the first step of `make serve`, names the package to install."""
    env = {"PATH": "/nonexistent", "HOME": os.environ.get("HOME", "/root")}
    result = subprocess.run(
        ["/bin/bash", "scripts/check_java.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "Java 17 is required" in result.stderr and "openjdk-17" in result.stderr
