"""Start, wait for, and stop one TorchServe instance that lives in its own state folder.

Each instance keeps everything in its state folder: the effective config.properties
(``config/config.properties`` plus overrides such as test ports), logs, the token key file
and TorchServe's pid file (TorchServe puts it in the temp folder, so each instance gets its
own TMPDIR). Stopping uses ``torchserve --stop`` with that same TMPDIR, so it only ever
stops the instance it started.

    python scripts/torchserve_ctl.py start [--state-dir .run]
    python scripts/torchserve_ctl.py stop  [--state-dir .run]
    python scripts/torchserve_ctl.py status
    python scripts/torchserve_ctl.py key inference      # for $(...) in curl commands
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "config" / "config.properties"
DEFAULT_STATE_DIR = ROOT / ".run"
MODEL_NAME = "bert"
ADDRESS_KEYS = ("inference_address", "management_address", "metrics_address")
PATH_KEYS = ("model_store", "metrics_config")
GRPC_PORT_KEYS = ("grpc_inference_port", "grpc_management_port")


class ServerError(RuntimeError):
    pass


def read_properties(path: Path) -> dict[str, str]:
    properties: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            properties[key.strip()] = value.strip()
    return properties


def effective_properties(
    overrides: dict[str, str] | None = None, base_config: Path = BASE_CONFIG
) -> dict[str, str]:
    """The base config with overrides applied and its paths made absolute."""
    properties = read_properties(base_config) | (overrides or {})
    for key in PATH_KEYS:
        if key in properties:
            path = Path(properties[key])
            properties[key] = str(path if path.is_absolute() else ROOT / path)
    return properties


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_port_overrides() -> dict[str, str]:
    """Free 127.0.0.1 ports for every listener, for a test or benchmark instance."""
    overrides = {key: f"http://127.0.0.1:{free_port()}" for key in ADDRESS_KEYS}
    return overrides | {key: str(free_port()) for key in GRPC_PORT_KEYS}


@dataclass(frozen=True)
class Server:
    state_dir: Path
    properties: dict[str, str]

    @property
    def inference_url(self) -> str:
        return self.properties["inference_address"].replace("0.0.0.0", "127.0.0.1")

    @property
    def management_url(self) -> str:
        return self.properties["management_address"]

    @property
    def metrics_url(self) -> str:
        return self.properties["metrics_address"]

    @property
    def tmp_dir(self) -> Path:
        return self.state_dir / "tmp"

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
        pid_file = self.tmp_dir / ".model_server.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def environment(self) -> dict[str, str]:
        return os.environ | {
            "TMPDIR": str(self.tmp_dir),
            "TEMP": str(self.tmp_dir),
            "LOG_LOCATION": str(self.state_dir / "logs"),
            "METRICS_LOCATION": str(self.state_dir / "logs"),
        }

    def workers_ready(self) -> bool:
        response = requests.get(
            f"{self.management_url}/models/{MODEL_NAME}",
            headers=self.headers("management"),
            timeout=5,
        )
        if response.status_code != 200:
            return False
        workers = response.json()[0].get("workers", [])
        return bool(workers) and all(worker.get("status") == "READY" for worker in workers)


def torchserve_command() -> str:
    return shutil.which("torchserve", path=str(Path(sys.executable).parent)) or "torchserve"


def server_for(state_dir: Path) -> Server:
    """The instance whose state lives in ``state_dir`` (its effective config must exist)."""
    config = state_dir / "config.properties"
    if not config.is_file():
        raise ServerError(f"no TorchServe state in {state_dir}")
    return Server(state_dir=state_dir, properties=read_properties(config))


def start(
    state_dir: Path,
    overrides: dict[str, str] | None = None,
    ready_timeout: float = 180,
    base_config: Path = BASE_CONFIG,
) -> Server:
    """Start an instance and return once its model's workers are READY.

    ``base_config`` is config/config.properties unless another layout's config is started
    (the container layout of scripts/deploy_layout.py, for its test).
    """
    state_dir = state_dir.resolve()
    properties = effective_properties(overrides, base_config)
    server = Server(state_dir=state_dir, properties=properties)
    if server.pid() is not None:
        raise ServerError(f"TorchServe already runs from {state_dir} (pid {server.pid()})")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ServerError(
            "Java 17 is required by TorchServe's frontend: install a JDK (apt-get install openjdk-17-jdk-headless)"
        )
    store = Path(properties["model_store"])
    for model in filter(None, properties.get("load_models", "").split(",")):
        if not (store / model).is_file():
            raise ServerError(f"{store / model} is missing: run `make package` first")
    server.tmp_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "logs").mkdir(exist_ok=True)
    (state_dir / "key_file.json").unlink(missing_ok=True)
    config = state_dir / "config.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    with (state_dir / "logs" / "console.log").open("ab") as console:
        subprocess.run(
            [torchserve_command(), "--start", "--ncs", "--ts-config", str(config)],
            cwd=state_dir,
            env=server.environment(),
            stdout=console,
            stderr=console,
            stdin=subprocess.DEVNULL,
            check=True,
        )
    try:
        wait_ready(server, ready_timeout)
    except BaseException:
        stop(server)
        raise
    return server


def start_or_reuse(state_dir: Path, overrides: dict[str, str] | None = None) -> Server:
    """Idempotent start: keep a running instance unless its config or its .mar changed."""
    if (state_dir / "config.properties").is_file():
        server = server_for(state_dir)
        pid = server.pid()
        if pid is not None:
            started = (server.tmp_dir / ".model_server.pid").stat().st_mtime
            archive = Path(server.properties["model_store"]) / f"{MODEL_NAME}.mar"
            if server.properties != effective_properties(overrides):
                print("config.properties changed since TorchServe started: restarting")
            elif archive.stat().st_mtime > started:
                print(f"{archive.name} changed since TorchServe started: restarting")
            else:
                print(
                    f"TorchServe already runs from {state_dir} (pid {pid}), config and {archive.name} unchanged"
                )
                return server
            stop(server)
    return start(state_dir, overrides)


def curl_example(server: Server) -> str:
    """Copy-paste commands; the token is read from the key file, never printed."""
    ctl = os.path.relpath(__file__)
    state = os.path.relpath(server.state_dir)
    python = (
        os.path.relpath(sys.executable) if sys.executable.startswith(str(ROOT)) else sys.executable
    )
    token_auth = server.key("inference") is not None
    token = f"TOKEN=$({python} {ctl} key --state-dir {state})" if token_auth else "TOKEN="
    client = f"{Path(python).parent / 'bert-serve'} classify --url {server.inference_url}"
    if token_auth:
        client += f" --key-file {os.path.relpath(server.state_dir / 'key_file.json')}"
    return (
        "Try it:\n"
        f"  {token}\n"
        f'  curl -H "Authorization: Bearer $TOKEN" -H "Content-Type: text/plain" \\\n'
        f'       --data "An absolute delight from start to finish." {server.inference_url}/predictions/{MODEL_NAME}\n'
        f'  curl -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\\n'
        f"""       --data '{{"text": "A tedious, joyless mess."}}' {server.inference_url}/predictions/{MODEL_NAME}\n"""
        f'  {client} "An absolute delight from start to finish."\n'
        f"  {client} --file texts.txt --out results.jsonl"
    )


def wait_ready(server: Server, timeout: float) -> None:
    """Poll /ping and the workers until READY, failing fast if the frontend died."""
    deadline = time.monotonic() + timeout
    time.sleep(1)
    while time.monotonic() < deadline:
        if server.pid() is None:
            raise ServerError(f"TorchServe exited during start; see {server.state_dir / 'logs'}")
        try:
            ping = requests.get(f"{server.inference_url}/ping", headers=server.headers(), timeout=5)
            if ping.status_code == 200 and server.workers_ready():
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise ServerError(
        f"TorchServe was not ready within {timeout:.0f} s; see {server.state_dir / 'logs'}"
    )


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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["start", "stop", "status", "key", "url"])
    parser.add_argument(
        "kind", nargs="?", default="inference", help="with key: inference, management or API"
    )
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = parser.parse_args()
    state_dir = args.state_dir.resolve()
    try:
        if args.command == "start":
            server = start_or_reuse(state_dir)
            print(
                f"TorchServe is ready on {server.inference_url} (pid {server.pid()}, state in {state_dir})"
            )
            print(curl_example(server))
            return 0
        if args.command == "stop" and not (state_dir / "config.properties").is_file():
            print("TorchServe is not running")
            return 0
        server = server_for(state_dir)
        if args.command == "stop":
            stop(server)
            print("TorchServe stopped")
        elif args.command == "status":
            pid = server.pid()
            print(f"running, pid {pid}, {server.inference_url}" if pid else "not running")
            return 0 if pid else 1
        elif args.command == "url":
            print(server.inference_url)
        else:
            print(server.key(args.kind) or "")
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
