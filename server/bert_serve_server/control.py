"""One TorchServe instance, from its start to its stop, in a state folder of its own: its view
(``Server``: addresses, token, pid, models, workers and their memory), its start, the wait until
it is READY, its stop, and the command line over them (``USAGE``: ``python -m bert_serve_server
start``, ``stop``, ``status``, ...).

Each instance keeps everything in its state folder: the effective config.properties, logs, the
token key file and TorchServe's pid file (TorchServe puts it in the temp folder, so each
instance gets its own TMPDIR). The pid file is trusted only while its process is TorchServe's
frontend (``/proc/<pid>/cmdline`` names ``org.pytorch.serve.ModelServer``): a stale file whose
pid the system gave to another process names no server.

A start writes the instance's effective config.properties (``config/config.properties`` plus
overrides such as test ports) sized for this machine (``bert_serve_server.sizing``, with what
``BERT_SERVE_*`` variables state), launches TorchServe with its own TMPDIR and waits until
every worker is READY (``bert_serve_server.ready``'s definition), reading the model log for a
worker that died loading. Stopping signals the frontend named by that TMPDIR's pid file (only
while that pid is TorchServe's frontend: ``Server.pid``), so it only ever stops the instance it
started, waits for it within a bound, and then kills it and the processes it started
(``stop``).

The server's workers are its concern too, in one place for every tool and test: their pids
(from the management API), killing one (only a process this frontend started), waiting for
the frontend to replace it, and their memory, always in MB (10**6 bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import requests

from bert_serve_server import sizing
from bert_serve_server.config import (
    BASE_CONFIG,
    PRECISION_ENV,
    ROOT,
    TS_CONFIG_ENV,
    effective_properties,
    local_port_overrides,
    models_entry_problems,
    parse_models,
    properties_text,
    read_models,
    read_properties,
    served_models,
    unready,
    without,
)
from bert_serve_server.rules import SizingError

USAGE = """Start, wait for, and stop one TorchServe instance that lives in its own state folder
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
COMMANDS = ["start", "stop", "status", "key", "url", "predict-url", "models"]
DEFAULT_STATE_DIR = ROOT / ".run"
STATE_DIR_ENV = "BERT_SERVE_STATE_DIR"
"""The state folder when ``--state-dir`` is not given: the image sets its home folder."""

THREADS_ENV = "OMP_NUM_THREADS"
TOKENIZER_THREADS_ENV = "RAYON_NUM_THREADS"
"""The tokenizer's threads (its Rust pool, one per CPU by default): the worker's share, the
torch threads, so that workers x their pools never outnumber the CPUs."""
"""How a worker's torch learns its thread count (``bert_serve_server.sizing``); a caller's own wins."""


START_ATTEMPTS = 3
PLAN_ENV = sizing.VARIABLES["plan"]
START_VARIABLES = (
    *sizing.VARIABLES.values(),
    "BERT_SERVE_MODEL_LOG_STDOUT",  # config/log4j2.xml reads these two when the frontend starts
    "BERT_SERVE_ACCESS_LOG_STDOUT",
)
"""The ``BERT_SERVE_*`` variables a start reads (what ``bert_serve_server.sizing`` takes as stated,
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


REPLACE_LIMIT_S = 60.0
FRONTEND_CLASS = "org.pytorch.serve.ModelServer"
"""What the frontend's command line names (TorchServe's own launcher checks the same)."""


def is_frontend(pid: int, proc: Path = Path("/proc")) -> bool:
    """``pid`` is a running TorchServe frontend (its command line names ``FRONTEND_CLASS``)."""
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return FRONTEND_CLASS.encode() in cmdline.split(b"\0")


class ServerError(RuntimeError):
    pass


class FrontendExited(ServerError):
    """The frontend died before it was ready: on free ports picked a moment earlier, most
    likely a port taken in between (a busy machine's outgoing connections use the same
    range), so ``start_on_free_ports`` tries again on new ones."""


class WorkerLoadFailed(ServerError):
    """Workers died loading their model: ``models`` says which (``NAME:VERSION``) and why."""

    def __init__(self, message: str, models: dict[str, str]) -> None:
        super().__init__(message)
        self.models = models


@dataclass(frozen=True)
class Worker:
    """One model worker as the management API lists it."""

    id: str
    pid: int
    status: str

    @property
    def ready(self) -> bool:
        return self.status == "READY"


MB = 10**6


@dataclass(frozen=True)
class WorkerMemory:
    pid: int
    rss_mb: float | None
    uss_mb: float | None
    """What this worker alone holds (unique set size)."""


@dataclass(frozen=True)
class Memory:
    """Resident memory in MB (10**6 bytes); None for a process that is gone."""

    frontend_rss_mb: float | None
    workers: dict[str, WorkerMemory]
    """By worker id (stable across a worker's restarts, unlike its pid)."""

    @property
    def workers_rss_mb(self) -> float:
        return round(sum(worker.rss_mb or 0.0 for worker in self.workers.values()), 1)


def rss_mb(pid: int | None) -> float | None:
    """A process's resident memory in MB; None if there is no such process."""
    try:
        return round(psutil.Process(pid).memory_info().rss / MB, 1) if pid else None
    except psutil.Error:
        return None


def worker_memory(pid: int) -> WorkerMemory:
    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return WorkerMemory(pid, None, None)
    return WorkerMemory(pid, round(info.rss / MB, 1), round(info.uss / MB, 1))


@dataclass(frozen=True)
class Server:
    state_dir: Path
    properties: dict[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set for this server's frontend and workers over the caller's own (an A/B of
    an environment setting: ``lab.load.servers``' ``envs``)."""
    in_force: dict[str, Any] | None = field(default=None, compare=False)
    """What the start that returned this server chose and why, as it recorded it in
    ``sizing_file``; None for an instance found in its state folder (``sizing()`` reads it)."""

    @property
    def inference_url(self) -> str:
        return self.properties["inference_address"].replace("0.0.0.0", "127.0.0.1")

    def model_names(self) -> list[str]:
        """The names this instance serves, as its config's ``models=`` lists them."""
        return list(served_models(self.properties))

    def versions(self, name: str) -> list[str]:
        return list(served_models(self.properties)[name])

    def default_version(self, name: str) -> str:
        """The version its config makes the default (the first it loads)."""
        versions = served_models(self.properties)[name]
        marked = [v for v, entry in versions.items() if entry.get("defaultVersion")]
        return (marked or list(versions))[0]

    @property
    def model_name(self) -> str:
        """The first model it serves (``bert`` for ``make serve`` without MODELS)."""
        return self.model_names()[0]

    @property
    def predict_url(self) -> str:
        return self.predict_url_for(self.model_name)

    def predict_url_for(self, name: str, version: str | None = None) -> str:
        suffix = f"/{version}" if version else ""
        return f"{self.inference_url}/predictions/{name}{suffix}"

    @property
    def management_url(self) -> str:
        return self.properties["management_address"]

    @property
    def metrics_url(self) -> str:
        return self.properties["metrics_address"]

    @property
    def sizing_file(self) -> Path:
        """The config before ``bert_serve_server.sizing`` filled it in, and what it chose and why."""
        return self.state_dir / "sizing.json"

    def sizing(self) -> dict[str, Any]:
        return dict(json.loads(self.sizing_file.read_text()))

    @property
    def tmp_dir(self) -> Path:
        return self.state_dir / "tmp"

    @property
    def model_log(self) -> Path:
        """The workers' log: the handler's lines, including its per-batch ``batch_size=...``."""
        return self.state_dir / "logs" / "model_log.log"

    @property
    def access_log(self) -> Path:
        """The frontend's line per request, ending in its status and its time in the frontend
        (ms, from the request read to the answer written: TorchServe's ``Session``)."""
        return self.state_dir / "logs" / "access_log.log"

    def key(self, kind: str) -> str | None:
        """A token from key_file.json ('inference', 'management' or 'API'); None if auth is off."""
        key_file = self.state_dir / "key_file.json"
        if not key_file.is_file():
            return None
        return str(json.loads(key_file.read_text())[kind]["key"])

    def headers(self, kind: str = "inference") -> dict[str, str]:
        key = self.key(kind)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def pid(self) -> int | None:
        """The frontend's pid while it runs."""
        pid_file = self.tmp_dir / ".model_server.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if is_frontend(pid) else None

    def describe(self, name: str, version: str | None = None) -> list[dict[str, Any]]:
        """The management API's description of a model: its default version, ``version``, or
        every version ("all")."""
        suffix = f"/{version}" if version else ""
        response = requests.get(
            f"{self.management_url}/models/{name}{suffix}",
            headers=self.headers("management"),
            timeout=30,
        )
        response.raise_for_status()
        return [dict(entry) for entry in response.json()]

    def model(self, name: str | None = None) -> dict[str, Any]:
        """A model's default version as the management API describes it (batch settings,
        workers, ...); the first model unless ``name``."""
        return self.describe(name or self.model_name)[0]

    def workers(self) -> list[Worker]:
        """Every served model's workers, all versions; [] while the management API does not
        answer (starting, stopping), so a caller polling for a state simply polls again."""
        try:
            listed = [
                worker
                for name in self.model_names()
                for entry in self.describe(name, "all")
                for worker in entry.get("workers", [])
            ]
            return [Worker(str(w["id"]), int(w["pid"]), str(w["status"])) for w in listed]
        except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
            return []

    def archives(self) -> list[Path]:
        """The .mar files it loads at start."""
        store = Path(self.properties["model_store"])
        return [store / name for name in self.properties.get("load_models", "").split(",") if name]

    def worker_pid(self) -> int | None:
        """The pid of the first READY worker; None while none is READY."""
        ready = [worker.pid for worker in self.workers() if worker.ready]
        return ready[0] if ready else None

    def workers_ready(self) -> bool:
        """Started: every served model version has workers, all READY (``config.unready``, the
        startup probe's definition)."""
        models = served_models(self.properties)
        try:
            described = {name: self.describe(name, "all") for name in models}
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return False
        return not unready(models, described, every_worker=True)

    def is_worker(self, pid: int) -> bool:
        """True if ``pid`` is a process this server's frontend started (so safe to signal)."""
        frontend = self.pid()
        if frontend is None:
            return False
        try:
            return pid in {child.pid for child in psutil.Process(frontend).children(recursive=True)}
        except psutil.Error:
            return False

    def kill_worker(self, pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL unless told) to the worker ``pid``, that pid only, after
        checking that this frontend started it."""
        if not self.is_worker(pid):
            raise ServerError(f"pid {pid} is not a worker of this server; not signalled")
        os.kill(pid, sig)

    def wait_replaced(
        self, killed: int, before: Collection[int], timeout: float = REPLACE_LIMIT_S
    ) -> tuple[int, float]:
        """(the new worker's pid, seconds waited) once as many workers as ``before`` (the
        pids before the kill) are READY again and ``killed`` is not among them."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            workers = self.workers()
            pids = {worker.pid for worker in workers}
            replaced = len(workers) == len(before) and killed not in pids
            if replaced and all(worker.ready for worker in workers):
                return min(pids - set(before)), time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError(f"worker {killed} not replaced within {timeout:.0f} s")

    def memory(self) -> Memory:
        """The frontend's RSS and each worker's RSS and USS, in MB."""
        workers = {worker.id: worker_memory(worker.pid) for worker in self.workers()}
        return Memory(rss_mb(self.pid()), workers)

    def environment(self) -> dict[str, str]:
        """The frontend's environment, which its workers inherit: the caller's, with this
        server's ``env`` over it; its state folder decides where temporary files and logs go."""
        return (
            dict(os.environ)
            | dict(self.env)
            | {
                "TMPDIR": str(self.tmp_dir),
                "TEMP": str(self.tmp_dir),
                "LOG_LOCATION": str(self.state_dir / "logs"),
                "METRICS_LOCATION": str(self.state_dir / "logs"),
            }
        )


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
        server = replace(server, in_force=in_force)
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
    variables state (``sizing.read_stated``, a plan included) is taken as stated."""
    try:
        resolved = sizing.resolve(source, stated=sizing.read_stated(os.environ))
    except SizingError as error:
        raise ServerError(str(error)) from None
    refusals = "; ".join(f"model {key} refused: {why}" for key, why in resolved.refused.items())
    if not served_models(resolved.properties):
        raise ServerError(f"no model left to serve: {refusals}")
    if refusals:
        print(f"[server] {refusals}; serving the others", file=sys.stderr)
    threads = {
        name: str(resolved.torch_threads)
        for name in (THREADS_ENV, TOKENIZER_THREADS_ENV)
        if name not in os.environ
    }
    precisions = {PRECISION_ENV: sizing.chosen_precisions(resolved.properties)}
    server = Server(
        state_dir=state_dir,
        properties=resolved.properties,
        env=threads | precisions | dict(env or {}),
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


def distinct_local_ports() -> dict[str, str]:
    """``local_port_overrides`` drawn again until no two listeners share a port: each port is
    free when drawn and its probe closed before the next, so one can come twice: TorchServe
    then serves inference and management on that one port, and such a start was seen never
    READY."""
    while True:
        overrides = local_port_overrides()
        ports = [value.rsplit(":", 1)[-1] for value in overrides.values()]
        if len(set(ports)) == len(ports):
            return overrides


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
                overrides=distinct_local_ports() | overrides,
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


def wait_ready(server: Server, timeout: float, log_start: int | None = None) -> None:
    """Poll /ping and the workers until READY, failing fast if the frontend died or a worker
    died loading the model (it would fail the same way on every restart). ``log_start``: the
    model log's size before the start, so older runs' lines are not read; now by default."""
    deadline = time.monotonic() + timeout
    log = server.model_log
    if log_start is None:
        log_start = log.stat().st_size if log.is_file() else 0
    time.sleep(1)
    died_at: float | None = None
    while time.monotonic() < deadline:
        if server.pid() is None:
            raise FrontendExited(
                f"TorchServe exited during start; see {server.state_dir / 'logs'}; "
                f"its last lines: {log_tail(server)}"
            )
        if log.is_file() and (errors := worker_load_errors(read_from(log, log_start))):
            died_at = died_at or time.monotonic()
            if NO_CAUSE in errors.values() and time.monotonic() - died_at < CAUSE_WAIT_S:
                time.sleep(0.2)  # the traceback comes after the death line
                continue
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


LOG_TAIL_LINES = 8


WORKER_DIED = "Backend worker process died."
NO_CAUSE = "a worker died while loading the model"
CAUSE_WAIT_S = 5.0
"""How long a start waits, once a worker died with no error line yet, for its traceback: the
worker prints the death line first, and TorchServe logs each line as it relays it."""
ERROR_LINE = re.compile(r" - (\w[\w.]*(?:Error|Exception|Refused): .*)$")


def worker_load_error(log_text: str) -> str | None:
    """Once a worker died in ``log_text`` (the model log of a start), the first error line of
    its traceback (the handler's own reason, not the "500 - Unknown exception" TorchServe
    re-raises), or a plain "a worker died"; None while no worker died."""
    lines = log_text.splitlines()
    if not any(line.endswith(WORKER_DIED) for line in lines):
        return None
    errors = [match.group(1) for match in map(ERROR_LINE.search, lines) if match]
    return errors[0] if errors else NO_CAUSE


WORKER_TAG = re.compile(r" W-\d+-(\S+)-std(?:out|err) ")
"""The worker's tag in a model log line: ``W-<port>-<name>_<version>-stdout``."""


def worker_load_errors(log_text: str) -> dict[str, str]:
    """``worker_load_error`` for each worker tag's lines (``<name>_<version>``)."""
    by_tag: dict[str, list[str]] = {}
    for line in log_text.splitlines():
        match = WORKER_TAG.search(line)
        by_tag.setdefault(match.group(1) if match else "", []).append(line)
    return {
        tag: error
        for tag, lines in by_tag.items()
        if (error := worker_load_error("\n".join(lines))) is not None
    }


def failed_models(served: dict[str, list[str]], errors: dict[str, str]) -> dict[str, str]:
    """The worker tags of ``errors`` as the ``NAME:VERSION`` they serve (``served``: each
    name's versions)."""
    keys = {
        f"{name}_{version}": f"{name}:{version}"
        for name, versions in served.items()
        for version in versions
    }
    return {keys.get(tag, tag): error for tag, error in errors.items()}


def log_tail(server: Server) -> str:
    """The frontend's last console and log lines, for an error message that outlives a
    temporary state folder."""
    lines: list[str] = []
    for name in ("console.log", "ts_log.log"):
        path = server.state_dir / "logs" / name
        if path.is_file():
            lines += path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return " | ".join(line.strip() for line in lines if line.strip()) or "(no log lines)"


def read_from(path: Path, offset: int) -> str:
    with path.open("rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")


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


def start_command(state_dir: Path, args: argparse.Namespace) -> int:
    overrides = None
    if problem := precision_problem(args.precision):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.models:
        from bert_serve_server.archive import package_models  # only --models packs

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
    """The values that follow the machine, as in force, and why (``bert_serve_server.sizing``):
    as the start that returned ``server`` chose them, else as its state folder records them.
    The image's entrypoint records no sizing.json: its sizing step printed the same at start."""
    chosen = server.in_force
    if chosen is None:
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
        description=USAGE,
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
            return start_command(state_dir, args)
        if args.command == "stop" and not (state_dir / "config.properties").is_file():
            print("TorchServe is not running")
            return 0
        if args.timeout is not None and not 0 < args.timeout < float("inf"):
            parser.error(f"--timeout must be more than 0 seconds, got {args.timeout}")
        return query(args.command, server_for(state_dir), args.kind, args.model, args.timeout)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
