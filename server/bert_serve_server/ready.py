"""``python -m bert_serve_server ready``: the pod's probes and drain (deploy/k8s/deployment.yaml).

TorchServe's ``/ping`` answers Healthy once the frontend has started its workers, before any
model is loaded and while a failing worker retries; a pod that said ready then would take
traffic it can only queue. This command asks TorchServe's management API (its public API for
worker status, on 127.0.0.1 inside the pod) about every version of every model the config
serves:

    python -m bert_serve_server ready [--config PATH]            # readiness: >= 1 READY worker each
    python -m bert_serve_server ready --startup [--config PATH]  # startup: every worker READY
    python -m bert_serve_server ready --live [--config PATH]     # liveness: /ping answers
    python -m bert_serve_server ready --drain [--wait-port 8000] [--deadline S]

``--drain`` is what deploy/entrypoint.sh runs on SIGTERM before
``torchserve --stop`` (which drops the requests TorchServe holds): it marks the pod not ready,
waits while something in the pod still listens on ``--wait-port`` (the proxy, which keeps
accepting for its stop delay) and then while connections to it are open (it finishes what it
took), then waits until every
request TorchServe accepted has been answered, polling with a growing pause, within
``--deadline`` seconds from its start.

It reads the config TorchServe runs (the entrypoint's sized copy, ``$HOME/config.properties``,
by default) for the addresses and the models, and imports nothing but the standard library and
that config reader, so a probe every few seconds costs little. It prints why it is not ready.

What "ready" and "drained" mean, as pure functions of what TorchServe's public APIs answer
(the management API's model descriptions and the metrics API's text), defined here once for the
probes, the drain and ``make serve``'s wait (``control.Server.workers_ready``):

- **Serving** (the readiness probe): every version of every model the config serves has at
  least one READY worker. One worker restarting after a crash or a ``responseTimeout`` leaves
  the others serving; the pod stays in the Service.
- **Started** (the startup probe, ``make serve``): every version has workers and all of them
  are READY, as at the end of a start that loaded everything.
- **Drained**: every request TorchServe accepted has been answered. The management API's
  ``pendingRequests`` counts the queue only, not the batches other workers are running, so
  the metrics API is read too: per model, the frontend's ``ts_inference_requests_total``
  (counted as a request is accepted) against the handler's ``BatchItems`` (the requests of
  each batch it answered, config/metrics.yaml). A request the frontend answers without the
  handler (a 503 for a full queue, a batch whose worker died) never reaches ``BatchItems``:
  the difference then stays above 0 and the drain ends at its deadline, erring on waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bert_serve_server.config import read_properties, served_models, unready

TIMEOUT_S = 3.0
DRAIN_DEADLINE_S = 70.0
"""The drain's bound from SIGTERM: the proxy's stop delay (10 s, deploy/k8s/deployment.yaml)
plus the longest answer (the model's responseTimeout, 60 s, config/model-config.yaml): a
request accepted at the end of that delay is answered, or timed out by TorchServe, by then."""

ACCEPTED = "ts_inference_requests_total"
"""The frontend's count of the requests it accepted, by ``model_name`` and ``model_version``
(``default`` for a request that names no version)."""
ANSWERED = "BatchItems"
"""The handler's count of the requests in the batches it answered (``ModelName``)."""
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)\s*$")


def counts(metrics_text: str, metric: str, label: str) -> dict[str, float]:
    """A counter of the metrics API's text, summed by the value of ``label``."""
    found: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = SAMPLE.match(line)
        if not match or match.group(1) != metric:
            continue
        value = re.search(rf'(?:^|,){label}="([^"]*)"', match.group(2))
        if value:
            found[value.group(1)] = found.get(value.group(1), 0.0) + float(match.group(3))
    return found


def unanswered(metrics_text: str, names: Iterable[str]) -> dict[str, int]:
    """Per model, the requests the frontend accepted that the handler has not answered; only
    models with some left."""
    accepted = counts(metrics_text, ACCEPTED, "model_name")
    answered = counts(metrics_text, ANSWERED, "ModelName")
    left = {name: round(accepted.get(name, 0.0) - answered.get(name, 0.0)) for name in names}
    return {name: count for name, count in left.items() if count > 0}


def sized_config() -> Path:
    """Where deploy/entrypoint.sh writes the config TorchServe runs."""
    return Path(os.environ.get("HOME", "/home/model-server")) / "config.properties"


def local(address: str) -> str:
    """A listener's address as reached from inside the pod (0.0.0.0 is every interface)."""
    return address.replace("://0.0.0.0:", "://127.0.0.1:").rstrip("/")


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None


def describe_all(properties: dict[str, str]) -> dict[str, list[dict[str, Any]] | None]:
    """The management API's ``/models/NAME/all`` for each served model (None where it
    answered no list); OSError when it does not answer at all."""
    management = local(properties.get("management_address", "http://127.0.0.1:8081"))
    described: dict[str, list[dict[str, Any]] | None] = {}
    for name in served_models(properties):
        status, body = get_json(f"{management}/models/{name}/all")
        described[name] = body if status == 200 and isinstance(body, list) else None
    return described


def not_ready(properties: dict[str, str], every_worker: bool = False) -> list[str]:
    """Why the served models are not ready (``every_worker``: not started); empty when they are."""
    try:
        described = describe_all(properties)
    except (OSError, ValueError) as error:
        management = local(properties.get("management_address", "http://127.0.0.1:8081"))
        return [f"the management API at {management} does not answer: {error}"]
    return unready(served_models(properties), described, every_worker)


def draining_marker() -> Path:
    return sized_config().with_name("draining")


def listening(port: int) -> bool:
    """Something in the pod (its network namespace) accepts connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S):
            return True
    except OSError:
        return False


ESTABLISHED = "01"
"""A TCP socket's state in /proc/net/tcp when connected."""


def established_on(port: int, tables: str) -> int:
    """Connections in the ESTABLISHED state whose local port is ``port``, in the text of
    /proc/net/tcp and /proc/net/tcp6 (the pod's network namespace: the proxy's, too)."""
    count = 0
    for line in tables.splitlines():
        fields = line.split()
        if len(fields) > 3 and ":" in fields[1] and fields[3] == ESTABLISHED:
            try:
                count += int(fields[1].rsplit(":", 1)[1], 16) == port
            except ValueError:
                continue
    return count


def tcp_tables() -> str:
    texts = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            texts.append(Path(name).read_text())
        except OSError:
            continue
    return "\n".join(texts)


FIRST_PAUSE_S = 0.05
LONGEST_PAUSE_S = 1.0
"""The drain's polls: a pause that doubles from a tenth of a short batch to a second."""


def poll(done: Callable[[], str | None], deadline: float) -> str | None:
    """Call ``done`` (None when done, else why not) with a doubling pause until it is done or
    ``deadline`` (monotonic) passes; the last reason when it does."""
    pause = FIRST_PAUSE_S
    while True:
        why = done()
        if why is None or time.monotonic() + pause > deadline:
            return why
        time.sleep(pause)
        pause = min(2 * pause, LONGEST_PAUSE_S)


def drain(properties: dict[str, str], deadline_s: float, wait_port: int | None = None) -> list[str]:
    """Mark the pod not ready; if ``wait_port`` is given (the proxy's), wait until nothing
    listens there (the proxy has stopped accepting) and no connection to it is open (it has
    answered all it accepted, with TorchServe's answers); then until every request the
    frontend accepted has been answered (``unanswered``), all within ``deadline_s``."""
    draining_marker().touch()
    deadline = time.monotonic() + deadline_s
    if wait_port is not None:
        why = poll(
            lambda: f"port {wait_port} still accepts" if listening(wait_port) else None, deadline
        )
        if why is None:
            why = poll(
                lambda: (
                    f"{open_} connection(s) to port {wait_port} still open"
                    if (open_ := established_on(wait_port, tcp_tables()))
                    else None
                ),
                deadline,
            )
        if why:
            return [f"{why} after {deadline_s:g} s"]
    metrics = local(properties.get("metrics_address", "http://127.0.0.1:8082"))
    names = list(served_models(properties))

    def left() -> str | None:
        try:
            with urllib.request.urlopen(f"{metrics}/metrics", timeout=TIMEOUT_S) as response:
                text = response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            return f"the metrics API answered {error.code}"
        except (OSError, ValueError) as error:
            raise Gone(str(error)) from error
        waiting = unanswered(text, names)
        return f"requests not answered yet: {waiting}" if waiting else None

    try:
        why = poll(left, deadline)
    except Gone as error:
        return [f"TorchServe does not answer ({error}): nothing left to drain there"]
    return [f"{why} after {deadline_s:g} s"] if why else []


class Gone(Exception):
    """TorchServe's listeners refuse: the frontend is gone, and with it what it held."""


def not_alive(properties: dict[str, str]) -> list[str]:
    inference = local(properties.get("inference_address", "http://127.0.0.1:8080"))
    try:
        status, body = get_json(f"{inference}/ping")
    except (OSError, ValueError) as error:
        return [f"{inference}/ping does not answer: {error}"]
    return [] if status == 200 else [f"{inference}/ping answered {status}: {body}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server ready", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--live", action="store_true", help="only check that /ping answers")
    parser.add_argument("--startup", action="store_true", help="every worker READY, not one each")
    parser.add_argument("--drain", action="store_true", help="wait until all is answered")
    parser.add_argument(
        "--wait-port", type=int, default=None, help="--drain: first wait until nothing listens here"
    )
    parser.add_argument(
        "--deadline", type=float, default=DRAIN_DEADLINE_S, help="--drain's bound, in s"
    )
    args = parser.parse_args(argv)
    config = args.config or sized_config()
    try:
        properties = read_properties(config)
    except OSError as error:
        print(f"not ready: {config} cannot be read ({error.strerror})", file=sys.stderr)
        return 1
    if args.drain:
        problems = drain(properties, args.deadline, args.wait_port)
        for problem in problems:
            print(f"drain: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.live:
        problems = not_alive(properties)
    elif draining_marker().exists():
        problems = ["draining: the server is stopping"]
    else:
        problems = not_ready(properties, every_worker=args.startup)
    for problem in problems:
        print(f"not {'alive' if args.live else 'ready'}: {problem}", file=sys.stderr)
    return 1 if problems else 0
