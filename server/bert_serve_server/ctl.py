"""Start, wait for, and stop one TorchServe instance that lives in its own state folder
(``bert_serve_server.control``: it only ever stops the instance it started).

    python -m bert_serve_server start [--state-dir .run]
    python -m bert_serve_server start --models "sentiment=DIR toxicity:2=DIR2"
    python -m bert_serve_server stop  [--state-dir .run] [--timeout S]
    python -m bert_serve_server status
    python -m bert_serve_server key inference      # for $(...) in curl commands
    python -m bert_serve_server url | predict-url [--model NAME] | models

Every command but ``start --models`` runs from the server package alone, as installed in the
image (no ``handler/`` there): ``status``, ``stop``, ``url``, ``predict-url``, ``models`` and
``key`` read the state folder, which in the image is the home folder the entrypoint writes
(``BERT_SERVE_STATE_DIR``, set by deploy/Dockerfile).

``stop`` sends the frontend SIGTERM, gives it ``--timeout`` seconds (``BERT_SERVE_STOP_S``, else
60) to exit, then kills it and the processes it started, and prints which it was
(``control.stop``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bert_serve_server.config import effective_properties, read_models
from bert_serve_server.control import (
    DEFAULT_STATE_DIR,
    Server,
    ServerError,
    curl_example,
    server_for,
    start_or_reuse,
    stop,
)
from bert_serve_server.models import package_models, parse_models

COMMANDS = ["start", "stop", "status", "key", "url", "predict-url", "models"]
STATE_DIR_ENV = "BERT_SERVE_STATE_DIR"
"""The state folder when ``--state-dir`` is not given: the image sets its home folder."""


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def precision_problem(precision: str | None) -> str | None:
    """Why ``--precision`` is refused; the choices are the handler's (``handler.settings``),
    imported here so that the commands the image runs never import the handler."""
    if precision is None:
        return None
    from handler.settings import PRECISION_CHOICES

    if precision in PRECISION_CHOICES:
        return None
    return f"--precision {precision}: choose from {', '.join(PRECISION_CHOICES)}"


def start(state_dir: Path, args: argparse.Namespace) -> int:
    overrides = None
    if problem := precision_problem(args.precision):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.models:
        try:
            specs = parse_models(args.models)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        store = Path(effective_properties()["model_store"])
        overrides, refused = package_models(
            specs, store, read_models(), args.model_config, args.precision
        )
        for key, why in refused.items():
            print(f"model {key} refused: {why}", file=sys.stderr)
        if overrides is None:
            print("error: no model left to serve", file=sys.stderr)
            return 1
    server = start_or_reuse(state_dir, overrides)
    print(
        f"TorchServe is ready on {server.inference_url} (pid {server.pid()}, state in {state_dir})"
    )
    print_sizing(server)
    print(curl_example(server))
    return 0


def print_sizing(server: Server) -> None:
    """The values that follow the machine, as in force, and why (``bert_serve_server.sizing``).
    The image's entrypoint records no sizing.json: its sizing step printed the same at start."""
    if not server.sizing_file.is_file():
        print(f"sizing: not recorded in {server.state_dir} (the start's own output has it)")
        return
    chosen = server.sizing()["in_force"]
    for name, versions in chosen["models"].items():
        for version, entry in versions.items():
            settings = ", ".join(f"{key} {value}" for key, value in entry.items())
            print(f"model {name} {version}: {settings}")
    for key, why in chosen.get("refused", {}).items():
        print(f"model {key} refused: {why}")
    print(
        f"job_queue_size {chosen['job_queue_size']}; torch threads per worker {chosen['torch_threads']}"
    )
    print(f"vmargs {chosen['vmargs']}")
    for reason in chosen["why"]:
        print(f"  why: {reason}")


def query(
    command: str,
    server: Server,
    kind: str,
    model: str | None = None,
    stop_timeout: float | None = None,
) -> int:
    """stop, status, key, url, predict-url, models on an instance that has a state folder."""
    if command == "stop":
        print(stop(server, stop_timeout))
    elif command == "status":
        pid = server.pid()
        print(f"running, pid {pid}, {server.inference_url}" if pid else "not running")
        if pid:
            print_sizing(server)
        return 0 if pid else 1
    elif command == "url":
        print(server.inference_url)
    elif command == "predict-url":
        print(server.predict_url_for(model or server.model_name))
    elif command == "models":
        print("\n".join(server.model_names()))
    else:
        print(server.key(kind) or "")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument(
        "kind", nargs="?", default="inference", help="with key: inference, management or API"
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help=f"default: ${STATE_DIR_ENV} or .run"
    )
    parser.add_argument(
        "--models", help='start: "NAME[:VERSION]=DIR ..." to serve (default: model_store/bert.mar)'
    )
    parser.add_argument(
        "--model-config", type=Path, help="start --models: the handler config of every model"
    )
    parser.add_argument("--precision", help="start --models: the handler's precision choices")
    parser.add_argument("--model", help="predict-url: which model (default: the first)")
    parser.add_argument(
        "--timeout",
        type=float,
        help="stop: seconds the frontend gets to exit after SIGTERM before it is killed "
        "(default: $BERT_SERVE_STOP_S or 60)",
    )
    args = parser.parse_args(argv)
    state_dir = (args.state_dir or default_state_dir()).resolve()
    try:
        if args.command == "start":
            return start(state_dir, args)
        if args.command == "stop" and not (state_dir / "config.properties").is_file():
            print("TorchServe is not running")
            return 0
        if args.timeout is not None and not 0 < args.timeout < float("inf"):
            parser.error(f"--timeout must be more than 0 seconds, got {args.timeout}")
        return query(args.command, server_for(state_dir), args.kind, args.model, args.timeout)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
