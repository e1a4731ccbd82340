"""Starting and stopping one TorchServe instance that lives in its own state folder
(``bert_serve_server.server.Server``: its view of an instance, re-exported here).

A start writes the instance's effective config.properties (``config/config.properties`` plus
overrides such as test ports) sized for this machine (``bert_serve_server.sizing``, with what
``BERT_SERVE_*`` variables state), launches TorchServe with its own TMPDIR and waits until
every worker is READY. Stopping uses ``torchserve --stop`` with that same TMPDIR, so it only
ever stops the instance it started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import requests

from bert_serve_server import sizing, start_log
from bert_serve_server.config import (
    BASE_CONFIG,
    ROOT,
    effective_properties,
    local_port_overrides,
    models_entry_problems,
    properties_text,
    read_properties,
)
from bert_serve_server.models import served_models, without
from bert_serve_server.plan import PlanError
from bert_serve_server.process_memory import MB, Memory, WorkerMemory, rss_mb
from bert_serve_server.rules import StatedError
from bert_serve_server.served import SizingError
from bert_serve_server.server import (
    REPLACE_LIMIT_S,
    FrontendExited,
    Server,
    ServerError,
    Worker,
    WorkerLoadFailed,
)
from bert_serve_server.size_cli import TS_CONFIG_ENV
from bert_serve_server.start_log import (
    failed_models,
    read_from,
    worker_load_error,
    worker_load_errors,
)
from bert_serve_server.stated import StatedValueError, read_stated

__all__ = [
    "MB", "REPLACE_LIMIT_S", "FrontendExited", "Memory", "Server", "ServerError", "Worker",
    "WorkerLoadFailed", "WorkerMemory", "log_tail", "rss_mb", "worker_load_error",
    "worker_load_errors",
]  # fmt: skip

DEFAULT_STATE_DIR = ROOT / ".run"
THREADS_ENV = "OMP_NUM_THREADS"
"""How a worker's torch learns its thread count (``bert_serve_server.sizing``); a caller's own wins."""


START_ATTEMPTS = 3


def torchserve_command() -> str:
    return shutil.which("torchserve", path=str(Path(sys.executable).parent)) or "torchserve"


def server_for(state_dir: Path) -> Server:
    """The instance whose state lives in ``state_dir`` (its effective config must exist)."""
    config = state_dir / "config.properties"
    if not config.is_file():
        raise ServerError(f"no TorchServe state in {state_dir}")
    return Server(state_dir=state_dir, properties=read_properties(config))


def check_startable(server: Server) -> None:
    """Refuse a second instance in one folder, a missing Java and a missing .mar, with the fix."""
    if server.pid() is not None:
        raise ServerError(f"TorchServe already runs from {server.state_dir} (pid {server.pid()})")
    if os.environ.get(TS_CONFIG_ENV):
        raise ServerError(
            f"{TS_CONFIG_ENV} is set: TorchServe would read {os.environ[TS_CONFIG_ENV]} in place "
            "of the config this start sizes and writes; unset it"
        )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ServerError(
            "Java 17 is required by TorchServe's frontend: install a JDK (apt-get install openjdk-17-jdk-headless)"
        )
    problems = models_entry_problems(server.properties.get("models", "{}"))
    if problems:
        raise ServerError("; ".join(problems))
    for archive in server.archives():
        if not archive.is_file():
            raise ServerError(f"{archive} is missing: run `make package` first")


def launch(server: Server) -> None:
    """Write the instance's config and run ``torchserve --start`` (it returns at once)."""
    server.tmp_dir.mkdir(parents=True, exist_ok=True)
    (server.state_dir / "logs").mkdir(exist_ok=True)
    (server.state_dir / "key_file.json").unlink(missing_ok=True)
    config = server.state_dir / "config.properties"
    config.write_text(properties_text(server.properties))
    with (server.state_dir / "logs" / "console.log").open("ab") as console:
        subprocess.run(
            [torchserve_command(), "--start", "--ncs", "--ts-config", str(config)],
            cwd=server.state_dir,
            env=server.environment(),
            stdout=console,
            stderr=console,
            stdin=subprocess.DEVNULL,
            check=True,
        )


def start(
    state_dir: Path,
    overrides: dict[str, str] | None = None,
    ready_timeout: float = 180,
    base_config: Path = BASE_CONFIG,
    env: Mapping[str, str] | None = None,
) -> Server:
    """Start an instance and return once its model's workers are READY.

    ``base_config`` is config/config.properties unless another layout's config is started
    (the container layout of ``layout.write_layout``, for its test); ``env``, see ``Server``.
    """
    state_dir = state_dir.resolve()
    source = effective_properties(overrides, base_config)
    check_startable(Server(state_dir=state_dir, properties=source))
    failed: dict[str, str] = {}
    while True:
        log = Server(state_dir, {}).model_log
        log_start = log.stat().st_size if log.is_file() else 0
        server, resolved = launch_sized(state_dir, without(source, failed), env)
        refused = resolved.refused | failed
        in_force = sizing.report(resolved) | {"refused": refused}
        server.sizing_file.write_text(
            json.dumps({"source": source, "in_force": in_force}, indent=2)
        )
        try:
            wait_ready(server, ready_timeout, log_start)
            return server
        except WorkerLoadFailed as error:
            stop(server)
            left = served_models(without(resolved.properties, error.models))
            if not left:
                raise
            print(f"[server] {error}; starting again without them", file=sys.stderr)
            failed |= error.models
        except BaseException:
            stop(server)
            raise


def launch_sized(
    state_dir: Path, source: dict[str, str], env: Mapping[str, str] | None
) -> tuple[Server, sizing.Resolved]:
    """Size ``source`` for this machine (``bert_serve_server.sizing``) and launch it; models that sizing
    refused are named on stderr, and when none is left nothing is launched. What ``BERT_SERVE_*``
    variables state (``bert_serve_server.stated``, a plan included) is taken as stated."""
    try:
        resolved = sizing.resolve(source, stated=read_stated(os.environ))
    except (SizingError, StatedError, StatedValueError, PlanError) as error:
        raise ServerError(str(error)) from None
    refusals = "; ".join(f"model {key} refused: {why}" for key, why in resolved.refused.items())
    if not served_models(resolved.properties):
        raise ServerError(f"no model left to serve: {refusals}")
    if refusals:
        print(f"[server] {refusals}; serving the others", file=sys.stderr)
    threads = {} if THREADS_ENV in os.environ else {THREADS_ENV: str(resolved.torch_threads)}
    server = Server(
        state_dir=state_dir, properties=resolved.properties, env=threads | dict(env or {})
    )
    launch(server)
    return server, resolved


@contextmanager
def running(
    overrides: dict[str, str] | None = None,
    prefix: str = "bert-serve-",
    state_dir: Path | None = None,
    base_config: Path = BASE_CONFIG,
    env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """A TorchServe on free 127.0.0.1 ports (unless ``overrides`` name others), in
    ``state_dir`` or a temporary state folder, always stopped."""
    with ExitStack() as stack:
        if state_dir is None:
            state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        server = start_on_free_ports(state_dir, overrides or {}, base_config, env)
        try:
            yield server
        finally:
            stop(server)


def start_on_free_ports(
    state_dir: Path,
    overrides: dict[str, str],
    base_config: Path = BASE_CONFIG,
    env: Mapping[str, str] | None = None,
) -> Server:
    """``start`` on free 127.0.0.1 ports (unless ``overrides`` name others), picked again
    when the frontend exits during start (``FrontendExited``)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return start(
                state_dir,
                overrides=local_port_overrides() | overrides,
                base_config=base_config,
                env=env,
            )
        except FrontendExited as error:
            if attempt == START_ATTEMPTS:
                raise
            print(f"[server] {error}; trying again on new ports", file=sys.stderr)
    raise AssertionError("unreachable")


def start_or_reuse(state_dir: Path, overrides: dict[str, str] | None = None) -> Server:
    """Idempotent start: keep a running instance unless its config or its .mar changed."""
    if (state_dir / "config.properties").is_file():
        server = server_for(state_dir)
        pid = server.pid()
        if pid is not None:
            started = (server.tmp_dir / ".model_server.pid").stat().st_mtime
            source = server.sizing()["source"] if server.sizing_file.is_file() else None
            if source != effective_properties(overrides):
                print("config.properties changed since TorchServe started: restarting")
            elif changed := [
                archive.name
                for archive in Server(state_dir, source).archives()
                if not archive.is_file() or archive.stat().st_mtime > started
            ]:
                print(f"{', '.join(changed)} changed since TorchServe started: restarting")
            else:
                names = ", ".join(archive.name for archive in server.archives())
                print(
                    f"TorchServe already runs from {state_dir} (pid {pid}), config and {names} unchanged"
                )
                return server
            stop(server)
    return start(state_dir, overrides)


def curl_example(server: Server) -> str:
    """Copy-paste commands; the token is read from the key file, never printed."""
    state = os.path.relpath(server.state_dir)
    python = (
        os.path.relpath(sys.executable) if sys.executable.startswith(str(ROOT)) else sys.executable
    )
    token_auth = server.key("inference") is not None
    token = (
        f"TOKEN=$({python} -m bert_serve_server key --state-dir {state})"
        if token_auth
        else "TOKEN="
    )
    client = f"{Path(python).parent / 'bert-serve'} classify --url {server.inference_url}"
    if token_auth:
        client += f" --key-file {os.path.relpath(server.state_dir / 'key_file.json')}"
    return (
        "Try it:\n"
        f"  {token}\n"
        f'  curl -H "Authorization: Bearer $TOKEN" -H "Content-Type: text/plain" \\\n'
        f'       --data "An absolute delight from start to finish." {server.predict_url}\n'
        f'  curl -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\\n'
        f"""       --data '{{"text": "A tedious, joyless mess."}}' {server.predict_url}\n"""
        f'  {client} "An absolute delight from start to finish."\n'
        f"  {client} --file texts.txt --out results.jsonl"
    )


def wait_ready(server: Server, timeout: float, log_start: int | None = None) -> None:
    """Poll /ping and the workers until READY, failing fast if the frontend died or a worker
    died loading the model (it would fail the same way on every restart). ``log_start``: the
    model log's size before the start, so older runs' lines are not read; now by default."""
    deadline = time.monotonic() + timeout
    log = server.model_log
    if log_start is None:
        log_start = log.stat().st_size if log.is_file() else 0
    time.sleep(1)
    while time.monotonic() < deadline:
        if server.pid() is None:
            raise FrontendExited(
                f"TorchServe exited during start; see {server.state_dir / 'logs'}; "
                f"its last lines: {log_tail(server)}"
            )
        if log.is_file() and (errors := worker_load_errors(read_from(log, log_start))):
            served = {name: server.versions(name) for name in server.model_names()}
            failed = failed_models(served, errors)
            if len(server.model_names()) == 1 and len(server.versions(server.model_name)) == 1:
                (error,) = failed.values()
                raise WorkerLoadFailed(
                    f"the model's worker failed to load: {error}; see {log}", failed
                )
            reasons = "; ".join(f"{key}: {error}" for key, error in failed.items())
            raise WorkerLoadFailed(f"workers failed to load: {reasons}; see {log}", failed)
        try:
            ping = requests.get(f"{server.inference_url}/ping", headers=server.headers(), timeout=5)
            if ping.status_code == 200 and server.workers_ready():
                return
        except (requests.RequestException, ValueError, KeyError):
            pass  # not up yet; TorchServe also leaves key_file.json briefly empty while writing it
        time.sleep(0.5)
    raise ServerError(
        f"TorchServe was not ready within {timeout:.0f} s; see {server.state_dir / 'logs'}"
    )


def log_tail(server: Server) -> str:
    """The frontend's last console and log lines (``start_log.log_tail``)."""
    return start_log.log_tail(server.state_dir)


def stop(server: Server, timeout: float = 60) -> None:
    """Stop this instance only (its own pid file) and wait until its process is gone."""
    pid = server.pid()
    if pid is None:
        return
    subprocess.run(
        [torchserve_command(), "--stop", "--foreground"],
        cwd=server.state_dir,
        env=server.environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        timeout=timeout + 10,
        check=False,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.2)
    raise ServerError(f"TorchServe (pid {pid}) did not stop within {timeout:.0f} s")
