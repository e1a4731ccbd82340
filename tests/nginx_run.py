"""The NGINX proxy of deploy/k8s/proxy/bert-serve.conf, run for real on this machine (for the
tests, as prometheus_run.py runs Prometheus).

The shipped file names the pod's addresses (listen 8000, TorchServe at 127.0.0.1:8080); a
local run changes only those two, puts the key where the image's entrypoint would (envsubst of
``${BERT_SERVE_PROXY_KEY}``), and wraps the file in the few top-level lines a standalone NGINX
needs (its pid file, logs and temp folders in a state folder of its own).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from bert_serve_server.config import ROOT, free_port

PROXY_CONF = ROOT / "deploy" / "k8s" / "proxy" / "bert-serve.conf"
POD_LISTEN = "listen 8000;"
POD_UPSTREAM = "server 127.0.0.1:8080;"
KEY_VARIABLE = "BERT_SERVE_PROXY_KEY"
KEY_PLACEHOLDER = "${" + KEY_VARIABLE + "}"
"""Replaced by the key at the container's start (deployment.yaml: NGINX_ENVSUBST_FILTER)."""
NGINX_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
START_LIMIT_S = 10.0

MAIN_CONF = """\
worker_processes 1;
pid {state}/nginx.pid;
error_log {state}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {state}/access.log;
    client_body_temp_path {state}/body;
    proxy_temp_path {state}/proxy;
    include {server};
}}
"""


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    return found or next((path for path in NGINX_PATHS if Path(path).is_file()), None)


def local_server_conf(listen_port: int, upstream: str, key: str | None) -> str:
    """The shipped server block with its listener and upstream moved (``upstream``:
    ``host:port``; each address must appear in the file exactly once) and ``key`` in place of
    its placeholder, as the image's entrypoint writes it (None: left as shipped, unreplaced)."""
    text = PROXY_CONF.read_text()
    for line in (POD_LISTEN, POD_UPSTREAM):
        if text.count(line) != 1:
            raise ValueError(f"{PROXY_CONF} must contain {line!r} exactly once")
    text = text.replace(POD_LISTEN, f"listen 127.0.0.1:{listen_port};")
    if key is not None:
        text = text.replace(KEY_PLACEHOLDER, key)
    return text.replace(POD_UPSTREAM, f"server {upstream};")


@contextmanager
def running_proxy(upstream: str, state: Path, key: str | None) -> Iterator[str]:
    """NGINX in front of ``upstream`` (``host:port``) on a free 127.0.0.1 port, requiring
    ``key``, until the block ends; yields its base URL."""
    binary = nginx_binary()
    if binary is None:
        raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx)")
    port = free_port()
    state.mkdir(parents=True, exist_ok=True)
    (state / "server.conf").write_text(local_server_conf(port, upstream, key))
    main = state / "nginx.conf"
    main.write_text(MAIN_CONF.format(state=state, server=state / "server.conf"))
    process = subprocess.Popen(
        [binary, "-c", str(main), "-p", str(state), "-e", str(state / "error.log")]
        + ["-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_listening(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_listening(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"nginx exited at start: {error.strip()}")
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.05)
    raise TimeoutError(f"nginx did not listen on {url} within {START_LIMIT_S:.0f} s")
