"""Starting and stopping one TorchServe instance that lives in its own state folder
(``bert_serve_server.server.Server``: its view of an instance, re-exported here).

A start writes the instance's effective config.properties (``config/config.properties`` plus
overrides such as test ports) sized for this machine (``bert_serve_server.sizing``, with what
``BERT_SERVE_*`` variables state), launches TorchServe with its own TMPDIR and waits until
every worker is READY. Stopping signals the frontend named by that TMPDIR's pid file (only
while that pid is TorchServe's frontend: ``Server.pid``), so it only ever stops the instance it
started, waits for it within a bound, and then kills it and the processes it started
(``stop``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
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
from bert_serve_server.stated import VARIABLES as STATED_VARIABLES
from bert_serve_server.stated import StatedValueError, read_stated

__all__ = [
    "MB", "REPLACE_LIMIT_S", "FrontendExited", "Memory", "Server", "ServerError", "Stopped",
    "Worker", "WorkerLoadFailed", "WorkerMemory", "log_tail", "rss_mb", "worker_load_error",
    "worker_load_errors",
]  # fmt: skip

DEFAULT_STATE_DIR = ROOT / ".run"
THREADS_ENV = "OMP_NUM_THREADS"
"""How a worker's torch learns its thread count (``bert_serve_server.sizing``); a caller's own wins."""


START_ATTEMPTS = 3
PLAN_ENV = STATED_VARIABLES["plan"]
START_VARIABLES = (
    *STATED_VARIABLES.values(),
    "BERT_SERVE_MODEL_LOG_STDOUT",  # config/log4j2.xml reads these two when the frontend starts
    "BERT_SERVE_ACCESS_LOG_STDOUT",
)
"""The ``BERT_SERVE_*`` variables a start reads (what ``bert_serve_server.stated`` takes as stated,
and the frontend's log config), recorded in ``sizing.json``: a change restarts ``start_or_reuse``'s
server. Others (the client's, ``BERT_SERVE_STOP_S``, ``BERT_SERVE_MEASURE_CACHE``: a cache of
what the same archive measures) change nothing a start decides."""
STOP_ENV = "BERT_SERVE_STOP_S"
"""Seconds the frontend gets to exit after SIGTERM before it is killed (``stop``)."""
DEFAULT_STOP_S = 60.0
"""TorchServe's own ``torchserve --stop --foreground`` waited as long (then gave up)."""
WORKERS_GRACE_S = 5.0
"""After the frontend exits, how long its workers get to follow before they are killed."""
KILL_WAIT_S = 10.0
"""How long a SIGKILLed process may take to be gone (its memory freed) before stop fails."""


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
        record = {"source": source, "in_force": in_force, "environment": start_environment()}
        server.sizing_file.write_text(json.dumps(record, indent=2))
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


def start_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What of ``environ`` a start reads and ``start_or_reuse`` compares: each of
    ``START_VARIABLES`` that is set (an empty one states nothing), the plan file's sha256 when
    ``BERT_SERVE_PLAN`` names one (its content is what is stated), and ``OMP_NUM_THREADS``, which
    wins over the torch threads the start would choose."""
    recorded = {
        name: environ[name].strip() for name in START_VARIABLES if environ.get(name, "").strip()
    }
    if PLAN_ENV in recorded:
        try:
            digest = hashlib.sha256(Path(recorded[PLAN_ENV]).read_bytes()).hexdigest()
        except OSError as error:
            digest = f"unreadable: {error.strerror}"
        recorded[f"{PLAN_ENV} sha256"] = digest
    if THREADS_ENV in environ:
        recorded[THREADS_ENV] = environ[THREADS_ENV]
    return recorded


def environment_changes(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """``NAME (old -> new)`` for each variable of ``start_environment`` that differs."""
    return [
        f"{name} ({before.get(name, 'unset')} -> {now.get(name, 'unset')})"
        for name in sorted(set(before) | set(now))
        if before.get(name) != now.get(name)
    ]


def start_or_reuse(state_dir: Path, overrides: dict[str, str] | None = None) -> Server:
    """Idempotent start: keep a running instance unless its config, its .mar or the variables
    its start read (``start_environment``) changed."""
    if (state_dir / "config.properties").is_file():
        server = server_for(state_dir)
        pid = server.pid()
        if pid is not None:
            started = (server.tmp_dir / ".model_server.pid").stat().st_mtime
            recorded = server.sizing() if server.sizing_file.is_file() else {}
            source = recorded.get("source")
            variables = environment_changes(recorded.get("environment", {}), start_environment())
            if source != effective_properties(overrides):
                print("config.properties changed since TorchServe started: restarting")
            elif variables:
                print(f"{', '.join(variables)} changed since TorchServe started: restarting")
            elif changed := [
                archive.name
                for archive in Server(state_dir, source).archives()
                if not archive.is_file() or archive.stat().st_mtime > started
            ]:
                print(f"{', '.join(changed)} changed since TorchServe started: restarting")
            else:
                names = ", ".join(archive.name for archive in server.archives())
                print(
                    f"TorchServe already runs from {state_dir} (pid {pid}), config, {names} and "
                    "BERT_SERVE_* variables unchanged"
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


def stop_bound(environ: Mapping[str, str] = os.environ) -> float:
    """``BERT_SERVE_STOP_S`` if set (seconds, more than 0), else ``DEFAULT_STOP_S``."""
    text = environ.get(STOP_ENV, "").strip()
    if not text:
        return DEFAULT_STOP_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ServerError(f"{STOP_ENV}={text!r}: a number of seconds, more than 0, is needed")
    return seconds


@dataclass(frozen=True)
class Stopped:
    """What ``stop`` did: the frontend's pid (None: none was running), how long it took, and
    what had to be killed: the frontend's process group, or the pids, of processes it started."""

    pid: int | None
    seconds: float = 0.0
    bound: float = 0.0
    exited_on_term: bool = True
    killed_group: int | None = None
    killed: tuple[int, ...] = ()

    def __str__(self) -> str:
        if self.pid is None:
            return "TorchServe is not running"
        said = f"TorchServe stopped: its frontend (pid {self.pid})"
        if self.exited_on_term:
            said += f" exited on SIGTERM in {self.seconds:.1f} s"
            if self.killed:
                said += (
                    f"; its workers still running {WORKERS_GRACE_S:g} s later were killed "
                    f"(pids {_pids(self.killed)})"
                )
            return said
        said += f" did not exit within {self.bound:g} s of SIGTERM, so it was killed"
        if self.killed_group is not None:
            said += f" with its process group {self.killed_group}"
        others = [pid for pid in self.killed if pid != self.pid]
        if others:
            said += f" and the processes it started (pids {_pids(others)})"
        return said


def _pids(pids: Iterable[int]) -> str:
    return ", ".join(str(pid) for pid in pids)


def _alive(process: psutil.Process) -> bool:
    """Running, as the same process (psutil compares its start time), and not a zombie: a
    killed child of the caller stays one until it is reaped, and holds nothing."""
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still alive after ``timeout`` s (the caller's own children are
    reaped on the way)."""
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            try:
                process.wait(timeout=0)  # reaps the caller's own child; a no-op otherwise
            except (psutil.TimeoutExpired, psutil.Error, ChildProcessError):
                pass
        alive = [process for process in processes if _alive(process)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _kill(processes: list[psutil.Process]) -> list[int]:
    """SIGKILL each process still alive, by pid (psutil checks it is still the same process)."""
    killed = []
    for process in processes:
        if not _alive(process):
            continue
        try:
            process.kill()
            killed.append(process.pid)
        except psutil.Error:
            pass
    return killed


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    try:
        return list(process.children(recursive=True))
    except psutil.Error:
        return []


def stop(server: Server, timeout: float | None = None) -> Stopped:
    """Stop this instance only, and say how (``Stopped``): SIGTERM to the frontend its own pid
    file names (``Server.pid``: only while that pid is TorchServe's frontend), a wait of
    ``timeout`` s (``BERT_SERVE_STOP_S``, else 60) for it to exit, then SIGKILL: to its process
    group when it leads one of its own (not the caller's), and by pid to it and every process
    it started (its workers), known before the kill. Workers still running 5 s after the
    frontend exited on its own are killed the same way. Nothing else is signalled. Raises
    ``ServerError`` if a killed process is not gone 10 s later."""
    bound = stop_bound() if timeout is None else timeout
    pid = server.pid()
    if pid is None:
        return Stopped(None)
    try:
        frontend = psutil.Process(pid)
        group = os.getpgid(pid)
    except (psutil.Error, OSError):
        return Stopped(pid)  # it exited in between
    started = _descendants(frontend)
    began = time.monotonic()
    try:
        frontend.send_signal(signal.SIGTERM)
    except psutil.Error:
        pass
    if not _wait_gone([frontend], bound):
        left = [process for process in started if _alive(process)]
        lingering = _wait_gone(left, WORKERS_GRACE_S)
        report = Stopped(pid, time.monotonic() - began, bound, killed=tuple(_kill(lingering)))
    else:
        known = {process.pid for process in started}
        started += [process for process in _descendants(frontend) if process.pid not in known]
        targets = [process for process in (frontend, *started) if _alive(process)]
        own_group = group == pid and group != os.getpgrp()
        if own_group:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                own_group = False  # the group ended in between; its members were killed by pid
        _kill(targets)
        report = Stopped(
            pid,
            time.monotonic() - began,
            bound,
            exited_on_term=False,
            killed_group=group if own_group else None,
            killed=tuple(process.pid for process in targets),
        )
    if survivors := _wait_gone([frontend, *started], KILL_WAIT_S):
        raise ServerError(
            f"{report}; yet pids {_pids([p.pid for p in survivors])} are still running"
        )
    server.tmp_dir.joinpath(".model_server.pid").unlink(missing_ok=True)
    (server.state_dir / "key_file.json").unlink(missing_ok=True)
    return report
