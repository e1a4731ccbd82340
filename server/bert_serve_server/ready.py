"""``python -m bert_serve_server ready``: the pod's probe (deploy/k8s/deployment.yaml).

TorchServe's ``/ping`` answers Healthy once the frontend has started its workers, before any
model is loaded and while a failing worker retries; a pod that said ready then would take
traffic it can only queue. This command asks TorchServe's management API (its public API for
worker status, on 127.0.0.1 inside the pod) for every version of every model the config
serves, and exits 0 only when each version has workers and every one of them is READY:

    python -m bert_serve_server ready [--config PATH]          # readiness and startup
    python -m bert_serve_server ready --live [--config PATH]   # liveness: /ping answers
    python -m bert_serve_server ready --drain [--config PATH]  # on SIGTERM, before the stop

``--drain`` is what deploy/entrypoint.sh runs on SIGTERM before ``torchserve --stop`` (which
drops the requests TorchServe holds): it marks the pod not ready, then sends each model a
request of its own behind whatever is queued and waits for its answer, until the queues are
empty (``pendingRequests`` of the management API), within ``--deadline`` seconds.

It reads the config TorchServe runs (the entrypoint's sized copy, ``$HOME/config.properties``,
by default) for the addresses and the models, and imports nothing but the standard library and
that config reader, so a probe every few seconds costs little. It prints why it is not ready.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bert_serve_server.config import read_properties

TIMEOUT_S = 3.0


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


def not_ready(properties: dict[str, str]) -> list[str]:
    """Why the models the config serves are not all READY; empty when they are."""
    management = local(properties.get("management_address", "http://127.0.0.1:8081"))
    models: dict[str, dict[str, Any]] = json.loads(properties.get("models", "{}"))
    problems = []
    for name, versions in models.items():
        try:
            status, described = get_json(f"{management}/models/{name}/all")
        except (OSError, ValueError) as error:
            return [f"the management API at {management} does not answer: {error}"]
        if status != 200 or not isinstance(described, list):
            problems.append(f"model {name}: the management API answered {status}")
            continue
        found = {str(entry.get("modelVersion")): entry.get("workers") or [] for entry in described}
        for version in versions:
            workers = found.get(str(version))
            if not workers:
                problems.append(f"model {name} {version}: no workers")
                continue
            states = [worker.get("status") for worker in workers]
            if any(state != "READY" for state in states):
                problems.append(f"model {name} {version}: workers {states}")
    if not models:
        problems.append("the config serves no model")
    return problems


def draining_marker() -> Path:
    return sized_config().with_name("draining")


def pending(properties: dict[str, str]) -> int:
    """Requests queued for every version of every model (the management API's count)."""
    management = local(properties.get("management_address", "http://127.0.0.1:8081"))
    total = 0
    for name in json.loads(properties.get("models", "{}")):
        _, described = get_json(f"{management}/models/{name}/all")
        for entry in described or []:
            total += int((entry.get("jobQueueStatus") or {}).get("pendingRequests", 0))
    return total


def drain(properties: dict[str, str], deadline_s: float) -> list[str]:
    """Mark the pod not ready, then send each model one request behind what is queued and wait
    for its answer, until nothing is queued: what was accepted before has been taken by a
    worker and, the queue being served in order, answered with or before it."""
    import time

    draining_marker().touch()
    inference = local(properties.get("inference_address", "http://127.0.0.1:8080"))
    names = list(json.loads(properties.get("models", "{}")))
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for name in names:
            request = urllib.request.Request(
                f"{inference}/predictions/{name}",
                data=b"drain",
                headers={"Content-Type": "text/plain"},
            )
            try:
                left = max(1.0, deadline - time.monotonic())
                with urllib.request.urlopen(request, timeout=left) as response:
                    response.read()
            except urllib.error.HTTPError:
                pass  # an answer all the same
            except OSError as error:
                return [f"{inference} does not answer: {error}"]
        try:
            if pending(properties) == 0:
                return []
        except (OSError, ValueError) as error:
            return [f"the management API does not answer: {error}"]
    return [f"requests still queued after {deadline_s:g} s"]


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
    parser.add_argument("--drain", action="store_true", help="wait out what is queued")
    parser.add_argument("--deadline", type=float, default=75.0, help="--drain's bound, in s")
    args = parser.parse_args(argv)
    config = args.config or sized_config()
    try:
        properties = read_properties(config)
    except OSError as error:
        print(f"not ready: {config} cannot be read ({error.strerror})", file=sys.stderr)
        return 1
    if args.drain:
        problems = drain(properties, args.deadline)
        for problem in problems:
            print(f"drain: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.live:
        problems = not_alive(properties)
    elif draining_marker().exists():
        problems = ["draining: the server is stopping"]
    else:
        problems = not_ready(properties)
    for problem in problems:
        print(f"not {'alive' if args.live else 'ready'}: {problem}", file=sys.stderr)
    return 1 if problems else 0
