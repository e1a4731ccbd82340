"""Run the bert-serve image and check it as a user would (``make image-test``).

Starts the container with its ports published on free 127.0.0.1 ports, waits for READY
(/ping healthy), sends the README's examples (raw text, JSON), a list, a pair and an Open
Inference (v2) request, reads /metrics, runs the image's health check, measures each
process's memory from the host after a short bounded burst, then sends SIGTERM and checks
the container exits 0 within the grace period. The container is always removed.
Writes the numbers to build/image/image-test.json.

    python scripts/image_test.py [--image bert-serve:0.1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300.0
DEPLOYMENT = ROOT / "deploy" / "k8s" / "deployment.yaml"
BURST_REQUESTS = 200
BURST_CLIENTS = 8
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def engine_command() -> list[str]:
    """The engine scripts/container_engine.sh finds (podman with runc here, or docker)."""
    found = subprocess.run(
        ["bash", str(ROOT / "scripts" / "container_engine.sh")], capture_output=True, text=True
    )
    if found.returncode != 0:
        raise SystemExit(f"no container engine: {found.stderr.strip()}")
    return found.stdout.split()


def grace_period_s() -> int:
    """The pod's terminationGracePeriodSeconds: the time the image gets to stop on SIGTERM."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    return int(deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


class Container:
    """One container of the image, named after this process, removed by ``remove``."""

    def __init__(self, engine: list[str], image: str) -> None:
        self.engine = engine
        self.image = image
        self.name = f"bert-serve-image-test-{os.getpid()}"
        self.http = free_port()
        self.metrics = free_port()

    def run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [*self.engine, *args], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self) -> None:
        self.run(
            "run", "--detach", "--name", self.name, *LIMITS,
            "--publish", f"127.0.0.1:{self.http}:8080",
            "--publish", f"127.0.0.1:{self.metrics}:8082",
            self.image,
        )  # fmt: skip

    def state(self, field: str) -> str:
        return self.run("inspect", "--format", "{{.State." + field + "}}", self.name)

    def logs(self) -> str:
        done = subprocess.run(
            [*self.engine, "logs", "--tail", "40", self.name],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return done.stdout + done.stderr

    def remove(self) -> None:
        subprocess.run([*self.engine, "rm", "--force", self.name], capture_output=True, timeout=120)


WORKER_STATES = (
    "import json, urllib.request; "
    "print(*(w['status'] for w in json.load(urllib.request.urlopen("
    "'http://127.0.0.1:8081/models/bert', timeout=5))[0]['workers']))"
)


def workers_ready(container: Container) -> bool:
    """All workers READY, from the management API, which listens inside the container only."""
    try:
        states = container.run("exec", container.name, "python3.11", "-c", WORKER_STATES)
    except RuntimeError:
        return False
    return bool(states) and all(state == "READY" for state in states.split())


def wait_ready(container: Container, started: float) -> tuple[float, float]:
    """Seconds from `run` until /ping answers Healthy, and until every worker is READY.

    /ping says Healthy as soon as the workers are started, before the model is loaded
    (and while a failing worker retries), so READY is read from the workers themselves.
    """
    url = f"http://127.0.0.1:{container.http}/ping"
    ping_s = None
    while time.monotonic() - started < READY_TIMEOUT_S:
        if container.state("Running") != "true":
            raise AssertionError(f"the container exited before READY:\n{container.logs()}")
        if ping_s is None:
            try:
                response = requests.get(url, timeout=5)
                if response.status_code == 200 and response.json().get("status") == "Healthy":
                    ping_s = time.monotonic() - started
            except requests.RequestException:
                pass
        if ping_s is not None and workers_ready(container):
            return ping_s, time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"not READY within {READY_TIMEOUT_S:.0f} s:\n{container.logs()}")


def check_requests(base: str, metrics_url: str) -> None:
    """The README's curl examples, a list, a pair, a v2 request, and /metrics."""
    predict = f"{base}/predictions/bert"
    text = requests.post(
        predict,
        data=b"An absolute delight from start to finish.",
        headers={"Content-Type": "text/plain"},
        timeout=30,
    )
    check(text.status_code == 200 and text.json()["label"] == "positive", f"text: {text.text}")
    single = requests.post(predict, json={"text": "A tedious, joyless mess."}, timeout=30)
    check(single.status_code == 200 and single.json()["label"] == "negative", single.text)
    listed = requests.post(predict, json={"texts": ["great film", "", "awful"]}, timeout=30)
    results = listed.json()["results"]
    check(listed.status_code == 200 and len(results) == 3, f"list: {listed.text}")
    check("label" in results[0] and results[1]["error"]["code"] == "empty_text", listed.text)
    pair = requests.post(
        predict, json={"text": "It rains.", "text_pair": "The street is wet."}, timeout=30
    )
    check(pair.status_code == 200 and "label" in pair.json(), f"pair: {pair.text}")
    v2 = requests.post(
        f"{base}/v2/models/bert/infer",
        json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["great film", "awful"]}]},
        timeout=30,
    )  # fmt: skip
    outputs = {output["name"]: output for output in v2.json().get("outputs", [])}
    check(v2.status_code == 200 and outputs["label"]["shape"] == [2], f"v2: {v2.text}")
    metrics = requests.get(f"{metrics_url}/metrics", timeout=30)
    check(metrics.status_code == 200, f"metrics: {metrics.status_code}")
    for name in ("ts_inference_requests_total", "ts_queue_latency_microseconds"):
        check(name in metrics.text, f"/metrics lacks {name}")


def burst(base: str) -> int:
    """A bounded burst of mixed requests so memory is measured warm; returns the 200s."""
    bodies: list[dict[str, Any]] = [
        {"text": "A tedious, joyless mess. " * 20},
        {"texts": ["great film"] * 16},
        {"text": "It rains.", "text_pair": "The street is wet."},
    ]

    def send(index: int) -> int:
        body = bodies[index % len(bodies)]
        return requests.post(f"{base}/predictions/bert", json=body, timeout=60).status_code

    with ThreadPoolExecutor(BURST_CLIENTS) as pool:
        return sum(code == 200 for code in pool.map(send, range(BURST_REQUESTS)))


def process_tree(root_pid: int) -> list[int]:
    """The container's processes as the host sees them (the engine runs them here)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def memory_mib(pid: int) -> dict[str, Any]:
    """RSS and PSS (shared pages split among their users) of one process, in MiB."""
    proc = Path(f"/proc/{pid}")
    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    fields = {}
    for line in (proc / "smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    if "org.pytorch.serve.ModelServer" in cmdline:
        role = "frontend"
    elif "model_service_worker" in cmdline:
        role = "worker"
    else:
        role = cmdline.split(" ", 1)[0].rsplit("/", 1)[-1]
    return {
        "pid": pid,
        "role": role,
        "rss_mib": round(fields["Rss"] / 1024, 1),
        "pss_mib": round(fields["Pss"] / 1024, 1),
    }


def container_memory(container: Container) -> list[dict[str, Any]]:
    root = int(container.state("Pid"))
    return [memory_mib(pid) for pid in process_tree(root)]


def stop_within_grace(container: Container, grace_s: int) -> float:
    """SIGTERM to the container's main process; seconds until it exited (0 required)."""
    started = time.monotonic()
    container.run("kill", "--signal", "TERM", container.name)
    while container.state("Running") == "true":
        if time.monotonic() - started > grace_s:
            raise AssertionError(f"still running {grace_s} s after SIGTERM:\n{container.logs()}")
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    code = container.state("ExitCode")
    check(code == "0", f"exit code {code} after SIGTERM:\n{container.logs()}")
    return elapsed


def step(name: str, action: Callable[[], Any]) -> Any:
    print(f"image-test: {name} ...", flush=True)
    return action()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", default=os.environ.get("IMAGE", "bert-serve:0.1.0"))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "image" / "image-test.json")
    args = parser.parse_args()
    grace_s = grace_period_s()
    container = Container(engine_command(), args.image)
    image_bytes = int(container.run("image", "inspect", "--format", "{{.Size}}", args.image))
    base = f"http://127.0.0.1:{container.http}"
    try:
        started = time.monotonic()
        step("start", container.start)
        ping_s, ready_s = step("wait for READY", lambda: wait_ready(container, started))
        print(f"image-test: /ping Healthy after {ping_s:.1f} s, READY after {ready_s:.1f} s")
        step("requests", lambda: check_requests(base, f"http://127.0.0.1:{container.metrics}"))
        if container.engine[0] == "podman":
            step("health check", lambda: container.run("healthcheck", "run", container.name))
        ok = step(f"burst of {BURST_REQUESTS}", lambda: burst(base))
        check(ok == BURST_REQUESTS, f"burst: {ok} of {BURST_REQUESTS} answered 200")
        processes = container_memory(container)
        cgroup = container.run("stats", "--no-stream", "--format", "{{.MemUsage}}", container.name)
        print(f"image-test: the engine's memory figure (page cache included): {cgroup}")
        for process in processes:
            print(f"image-test: memory {process}", flush=True)
        stop_s = step("SIGTERM", lambda: stop_within_grace(container, grace_s))
        print(f"image-test: stopped with exit code 0 after {stop_s:.1f} s", flush=True)
    finally:
        container.remove()
    result = {
        "image": args.image,
        "engine": " ".join(container.engine),
        "image_bytes": image_bytes,
        "ping_s": round(ping_s, 1),
        "ready_s": round(ready_s, 1),
        "stop_s": round(stop_s, 1),
        "grace_s": grace_s,
        "burst_requests": BURST_REQUESTS,
        "processes": processes,
        "engine_mem_usage": cgroup,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"image-test: passed; numbers in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
