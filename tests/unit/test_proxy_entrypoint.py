"""deploy/proxy/entrypoint.sh (the proxy image's) with a stand-in for nginx: the template gets
the key and nothing else substituted, and SIGTERM leaves nginx accepting for the stop delay,
then stops it gracefully (SIGQUIT), the container exiting with its status."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

ENTRYPOINT = ROOT / "deploy" / "proxy" / "entrypoint.sh"
# nginx -g 'daemon off;': serves until SIGQUIT (graceful: exit 0), records what it got. In
# Python, as nginx sets its own handlers: a shell's background job starts with SIGQUIT ignored,
# which a shell script could not undo.
FAKE_NGINX = """#!/usr/bin/env python3
import os, signal, sys, time
calls = open(os.environ["CALLS"], "a", buffering=1)
def quit(*_):
    calls.write(f"quit {time.time()}\\n")
    sys.exit(0)
def term(*_):
    calls.write("term\\n")
    sys.exit(1)
signal.signal(signal.SIGQUIT, quit)
signal.signal(signal.SIGTERM, term)
calls.write("serving\\n")
while True:
    time.sleep(0.05)
"""

pytestmark = pytest.mark.skipif(shutil.which("envsubst") is None, reason="envsubst is absent")


def start(tmp_path: Path, delay_s: str) -> subprocess.Popen[bytes]:
    nginx = tmp_path / "nginx"
    nginx.write_text(FAKE_NGINX)
    nginx.chmod(0o755)
    (tmp_path / "templates").mkdir()
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "templates" / "default.conf.template").write_text(
        'map $http_authorization $ok { "~^Bearer ${BERT_SERVE_PROXY_KEY}$" 1; }\n'
        "proxy_set_header Host $host; # ${HOME}\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CALLS": str(tmp_path / "calls"),
        "NGINX": str(nginx),
        "NGINX_TEMPLATES_DIR": str(tmp_path / "templates"),
        "NGINX_CONF_D": str(tmp_path / "conf.d"),
        "NGINX_ENVSUBST_FILTER": "^BERT_SERVE_PROXY_KEY$",
        "BERT_SERVE_PROXY_KEY": "k3y",
        "BERT_SERVE_PROXY_STOP_DELAY_S": delay_s,
    }
    return subprocess.Popen(["sh", str(ENTRYPOINT)], env=env)


def wait_serving(tmp_path: Path) -> None:
    deadline = time.monotonic() + 10
    while not (tmp_path / "calls").is_file():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_the_template_gets_the_key_and_nothing_else(tmp_path: Path) -> None:
    process = start(tmp_path, "0")
    wait_serving(tmp_path)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)
    written = (tmp_path / "conf.d" / "default.conf").read_text()
    assert '"~^Bearer k3y$" 1;' in written
    assert "proxy_set_header Host $host; # ${HOME}" in written


def test_sigterm_keeps_serving_for_the_delay_then_quits_gracefully(tmp_path: Path) -> None:
    process = start(tmp_path, "1.5")
    wait_serving(tmp_path)
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert process.poll() is None and "quit" not in (tmp_path / "calls").read_text()
    assert process.wait(timeout=10) == 0
    calls = (tmp_path / "calls").read_text().split("\n")[:-1]
    assert calls[0] == "serving" and calls[1].startswith("quit") and len(calls) == 2
    assert float(calls[1].split()[1]) - sent >= 1.4, "quit before the delay"
