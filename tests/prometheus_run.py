"""A real Prometheus (Debian's `prometheus` binary) on a free 127.0.0.1 port, scraping given
targets every second into a temporary folder, with the alerting rules loaded; always stopped
(by the process it started, nothing else)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from bert_serve_server.config import free_port

START_LIMIT_S = 30.0


def prometheus_binary() -> str | None:
    return shutil.which("prometheus") or next(
        (path for path in ("/usr/bin/prometheus",) if Path(path).is_file()), None
    )


def require_prometheus() -> str:
    """The binary; a skip that says why where it is absent, a failure under CI=true (CI
    installs it: scripts/ci_proxy_tools.sh)."""
    binary = prometheus_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is missing in CI: scripts/ci_proxy_tools.sh installs it")
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    return binary


@contextmanager
def running_prometheus(targets: list[str], state: Path, rules: Path) -> Iterator[str]:
    binary = require_prometheus()
    state.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "bert-serve", "static_configs": [{"targets": targets}]}],
    }
    (state / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (state / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={state / 'prometheus.yml'}",
            f"--storage.tsdb.path={state / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, state / "prometheus.log")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        log.close()


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited at start: {log.read_text()[-2000:]}")
        try:
            if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"prometheus was not ready on {url} within {START_LIMIT_S:.0f} s")


def api(url: str, path: str, **params: Any) -> Any:
    """The ``data`` of an HTTP API answer; AssertionError with Prometheus' own error else."""
    answer = requests.get(f"{url}/api/v1/{path}", params=params, timeout=30)
    body = answer.json()
    assert body.get("status") == "success", f"{params}: {body.get('error')}"
    return body["data"]
