"""One TorchServe instance as its tools see it, from its state folder: its addresses, token,
pid, models and workers.

Each instance keeps everything in its state folder: the effective config.properties, logs, the
token key file and TorchServe's pid file (TorchServe puts it in the temp folder, so each
instance gets its own TMPDIR). The pid file is trusted only while its process is TorchServe's
frontend (``/proc/<pid>/cmdline`` names ``org.pytorch.serve.ModelServer``): a stale file whose
pid the system gave to another process names no server.

The server's workers are its concern too, in one place for every tool and test: their pids
(from the management API), killing one (only a process this frontend started), waiting for
the frontend to replace it, and their memory, always in MB (10**6 bytes).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from bert_serve_server import readiness
from bert_serve_server.models import served_models
from bert_serve_server.process_memory import Memory, rss_mb, worker_memory

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


@dataclass(frozen=True)
class Server:
    state_dir: Path
    properties: dict[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set for this server's frontend and workers over the caller's own (an A/B of
    an environment setting: ``scripts/compare_mars.py --before-env``)."""

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
        """Started: every served model version has workers, all READY (``readiness.unready``,
        the startup probe's definition)."""
        models = served_models(self.properties)
        try:
            described = {name: self.describe(name, "all") for name in models}
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return False
        return not readiness.unready(models, described, every_worker=True)

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
