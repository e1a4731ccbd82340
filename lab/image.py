"""``make image-test``: the bert-serve image run as a user would (``python -m lab image-test
[--image bert-serve:0.1.0] [--out build/image/image-test.json]``).

One container under the Deployment's TorchServe limits (so the start sizes for what the pod
sees), its ports on free 127.0.0.1 ports, always removed; in order: READY (/ping, every worker,
and the pod's readiness probe not ready at first, then answering), the request checks and
the image's own (``CHECKS``, ``CONTAINER_CHECKS``), a warm burst and each process's memory from the host
(PSS, RSS), 256 patient clients never refused, SIGTERM under load (exit 0 within the grace
period, no accepted request lost); then a container whose model cannot load (it exits non-zero
with the traceback). The record's ``sized_from`` hashes what its figures depend on
(tests/unit/test_deploy.py). With ``--measured DIR`` (``pod-test --keep-measured``) the first
starts on what the pod measured.

``make models-start`` (``python -m lab models-start --image IMAGE --models 3 --out FILE``, this
module with ``--models``): ``models_start``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml
from bert_serve_server.config import BASE_CONFIG, ROOT, free_port, read_properties
from bert_serve_server.layout import container_properties

from lab.code_routes import WORKFLOW_NAME, build_workflow_archive
from lab.load import ClosedLoop, Job, statuses
from lab.report import tool_parser, write_json

READY_TIMEOUT_S = 300.0
PATIENT_CLIENTS = 256
PATIENT_S = 15.0
PATIENT_TIMEOUT_S = 60.0
STOP_CLIENTS = 32
STOP_AFTER_S = 3.0
READY_PROBE = ("python3.11", "-m", "bert_serve_server", "ready")
STARTUP_PROBE = (*READY_PROBE, "--startup")
SIZED_FILES = (
    "deploy/entrypoint.sh",
    *(f"server/bert_serve_server/{name}.py" for name in ("config", "probe", "rules", "sizing")),
)
"""What the record's figures depend on besides the image's packages: its ``sized_from``."""
DEPLOYMENT = ROOT / "deploy" / "k8s" / "deployment.yaml"
BURST_REQUESTS = 200
BURST_CLIENTS = 8
BURST_BODIES = (
    b'{"text": "' + b"A tedious, joyless mess. " * 20 + b'"}',
    b'{"texts": [' + b", ".join([b'"great film"'] * 16) + b"]}",
    b'{"text": "It rains.", "text_pair": "The street is wet."}',
)
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
STATED_ENV = {
    "BERT_SERVE_WORKERS": "2",
    "BERT_SERVE_THREADS": "1",
    "BERT_SERVE_BATCH_SIZE": "4",
    "BERT_SERVE_QUEUE": "64",
    "BERT_SERVE_HEAP": "384m",
}
"""What the pod test's second pod states (``bert_serve_server.sizing``, lab/pod.py): every value
the start would otherwise measure or derive, so it measures nothing; 2 workers where the pod's
limits give 1."""
MEASURED_INSIDE = "/home/model-server/measured"
"""deploy/entrypoint.sh's ``BERT_SERVE_MEASURE_CACHE``: ``$HOME/measured`` in the container."""
IMAGE_ARCHIVE = "/mnt/models/model-store/bert.mar"
"""Where the image holds the default model's archive (deploy/Dockerfile)."""
ARCHIVE_SOURCE = ROOT / "model_store" / "bert.mar"
"""The archive ``make image`` put there."""
UNKNOWN_MODEL_TYPE = "bert-serve-unknown"
TIMEOUT_S = 30.0
FRONTEND_METRICS = ("ts_inference_requests_total", "ts_queue_latency_microseconds")
"""The metrics TorchServe itself exports in Prometheus format (config/metrics.yaml adds ours)."""
# A request to the management API from inside the container (python3.11 is the image's):
# argv is method, path, body; prints the status, then the body.
MANAGEMENT_REQUEST = """\
import sys, urllib.error, urllib.request
request = urllib.request.Request(
    sys.argv[4] + sys.argv[2], data=sys.argv[3].encode() or None, method=sys.argv[1]
)
try:
    with urllib.request.urlopen(request, timeout=5) as response:
        status, body = response.status, response.read()
except urllib.error.HTTPError as error:
    status, body = error.code, error.read()
print(status)
sys.stdout.write(body.decode(errors="replace"))
"""


def management(
    calls: EngineCalls, container: str, method: str, path: str, body: bytes = b""
) -> tuple[int, str]:
    """A request to the management API inside the image's ``container`` (it listens there
    only): its status and body."""
    base = container_addresses()["management_address"]
    request = (MANAGEMENT_REQUEST, method, path, body.decode(), base)
    out = calls.run("exec", container, "python3.11", "-c", *request)
    status, _, text = out.partition("\n")
    return int(status), text


class ImageTestFailed(AssertionError):
    """The image (a container of it, or the pod) did not behave as it should; the message says
    how."""


def engine_command() -> list[str]:
    """The engine scripts/container_engine.sh finds (podman with runc here, or docker)."""
    found = subprocess.run(
        ["bash", str(ROOT / "scripts" / "container_engine.sh")], capture_output=True, text=True
    )
    if found.returncode != 0:
        raise SystemExit(f"no container engine: {found.stderr.strip()}")
    return found.stdout.split()


class EngineCalls:
    """The engine's commands for what it runs (a container, a pod): ``engine`` is its command
    line, ``env`` the environment it runs with (None: this process's)."""

    engine: list[str]
    env: dict[str, str] | None = None

    def _call(self, args: tuple[str, ...], timeout: float) -> subprocess.CompletedProcess[str]:
        command = [*self.engine, *args]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=self.env
        )

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """The engine's output; with ``check``, RuntimeError where it failed."""
        done = self._call(args, timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:3])} failed: {done.stderr.strip()[-2000:]}")
        return done.stdout.strip()

    def succeeds(self, *args: str) -> bool:
        """The engine's command (``exec`` of a probe, as kubelet runs it) exited 0."""
        return self._call(args, 60).returncode == 0

    def output(self, *args: str) -> str:
        """stdout and stderr together: ``logs`` gives the container's stderr on stderr."""
        done = self._call(args, 60)
        return done.stdout + done.stderr


def recorded(prog: str, out: Path, test: Callable[[Callable[[str], None]], dict[str, Any]]) -> int:
    """``test``, which says each step through its argument, its record written to ``out``; 1
    where it failed, the failure printed."""

    def say(line: str) -> None:
        print(f"{prog}: {line}", flush=True)

    try:
        result = test(say)
    except (ImageTestFailed, RuntimeError) as failure:
        print(f"{prog}: FAILED\n{failure}", file=sys.stderr)
        return 1
    write_json(out, result)
    say(f"passed; record in {out}")
    return 0


def wait_started(
    probe: Callable[[], bool],
    limit_s: float,
    logs: Callable[[], str],
    running: Callable[[], bool] = lambda: True,
) -> float:
    """Seconds until ``probe`` (the startup probe, as kubelet runs it) passes, polled every
    2 s; ImageTestFailed where the container exits or ``limit_s`` passes first."""
    started = time.monotonic()
    while not probe():
        elapsed = time.monotonic() - started
        if not running():
            raise ImageTestFailed(f"exited after {elapsed:.0f} s:\n{logs()}")
        if elapsed > limit_s:
            raise ImageTestFailed(f"not ready within {limit_s:.0f} s:\n{logs()}")
        time.sleep(2)
    return round(time.monotonic() - started, 1)


def pod_spec(deployment: Path = DEPLOYMENT) -> dict[str, Any]:
    """The Deployment's pod template spec."""
    return dict(yaml.safe_load(deployment.read_text())["spec"]["template"]["spec"])


def torchserve_container(deployment: Path = DEPLOYMENT) -> dict[str, Any]:
    (container,) = [c for c in pod_spec(deployment)["containers"] if c["name"] == "torchserve"]
    return dict(container)


def grace_period_s(deployment: Path = DEPLOYMENT) -> int:
    """The pod's terminationGracePeriodSeconds: the time the image gets to stop on SIGTERM."""
    return int(pod_spec(deployment)["terminationGracePeriodSeconds"])


def sized_from(root: Path = ROOT) -> str:
    """sha256 of ``SIZED_FILES``, in order: the entrypoint and sizing a record measured."""
    digest = hashlib.sha256()
    for name in SIZED_FILES:
        digest.update((root / name).read_bytes())
    return digest.hexdigest()


def pod_limits(deployment: Path = DEPLOYMENT) -> dict[str, str]:
    """The Deployment's TorchServe container limits, as the engine's ``--cpus`` and
    ``--memory`` take them (``1536Mi`` -> ``1536m``: the engine's m is MiB)."""
    limits = torchserve_container(deployment)["resources"]["limits"]
    cpu, memory = str(limits["cpu"]), str(limits["memory"])
    if not memory.endswith(("Mi", "Gi")):
        raise ValueError(f"unexpected memory limit {memory!r}")
    cpus = str(int(cpu[:-1]) / 1000) if cpu.endswith("m") else cpu
    return {"cpus": cpus, "memory": memory[:-2] + memory[-2].lower()}


def container_addresses() -> dict[str, str]:
    """The inference, metrics and management addresses inside the container, from the
    layout's config (the one baked into the image)."""
    properties = container_properties(read_properties(BASE_CONFIG))
    keys = ("inference_address", "metrics_address", "management_address")
    return {key: properties[key] for key in keys}


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@dataclass(frozen=True)
class Target:
    """Where the request checks reach the image: its published ports, as host URLs."""

    inference: str
    metrics: str

    @property
    def predict(self) -> str:
        return f"{self.inference}/predictions/bert"


# The checks, one function per concern: each returns the problems it found, none where the image
# answered as it should. To add one, write it and name it in ``CHECKS`` (it takes the published
# URLs, a ``Target``) or ``CONTAINER_CHECKS`` (it takes the ``Container``).


def problems(*expectations: tuple[bool, str]) -> list[str]:
    """The descriptions of the expectations that do not hold."""
    return [what for holds, what in expectations if not holds]


def post(target: Target, body: Any, path: str = "/predictions/bert") -> tuple[int, Any, str]:
    """POST ``body`` (JSON, or raw text where it is bytes): the status, the JSON answer (None
    where it is not JSON) and the answer as a problem shows it."""
    url = target.inference + path
    if isinstance(body, bytes):
        headers = {"Content-Type": "text/plain"}
        response = requests.post(url, data=body, headers=headers, timeout=TIMEOUT_S)
    else:
        response = requests.post(url, json=body, timeout=TIMEOUT_S)
    try:
        answer = response.json()
    except ValueError:
        answer = None
    return response.status_code, answer, f"{response.status_code} {response.text[:300]!r}"


def labelled(target: Target, body: Any, label: str | None = None) -> tuple[bool, str]:
    """A 200 whose answer has a label (``label`` where given), and the answer shown."""
    status, answer, shown = post(target, body)
    found = answer.get("label") if isinstance(answer, dict) else None
    return status == 200 and found is not None and label in (None, found), shown


def readme_examples(target: Target) -> list[str]:
    """The README's two curl examples, raw text and JSON, with the labels it shows."""
    raw, raw_shown = labelled(target, b"An absolute delight from start to finish.", "positive")
    single, shown = labelled(target, {"text": "A tedious, joyless mess."}, "negative")
    return problems((raw, f"raw text: {raw_shown}"), (single, f"JSON text: {shown}"))


def list_with_an_empty_item(target: Target) -> list[str]:
    """A list answers 200 with one result per text: the empty one an empty_text error."""
    status, answer, shown = post(target, {"texts": ["great film", "", "awful"]})
    results = answer.get("results") if isinstance(answer, dict) else None
    right = (
        status == 200
        and isinstance(results, list)
        and len(results) == 3
        and "label" in results[0]
        and results[1].get("error", {}).get("code") == "empty_text"
    )
    return problems((right, f"list: {shown}"))


def a_pair(target: Target) -> list[str]:
    pair, shown = labelled(target, {"text": "It rains.", "text_pair": "The street is wet."})
    return problems((pair, f"pair: {shown}"))


def open_inference_v2(target: Target) -> list[str]:
    """KServe's v2 protocol over HTTP: two texts in, a label tensor of shape [2] out."""
    texts = {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["great film", "awful"]}
    status, answer, shown = post(target, {"inputs": [texts]}, "/v2/models/bert/infer")
    outputs = answer.get("outputs", []) if isinstance(answer, dict) else []
    shapes = {output.get("name"): output.get("shape") for output in outputs}
    return problems((status == 200 and shapes.get("label") == [2], f"v2: {shown}"))


def prometheus_metrics(target: Target) -> list[str]:
    metrics = requests.get(f"{target.metrics}/metrics", timeout=TIMEOUT_S)
    return problems(
        (metrics.status_code == 200, f"/metrics: {metrics.status_code}"),
        *((name in metrics.text, f"/metrics lacks {name}") for name in FRONTEND_METRICS),
    )


CHECKS: tuple[tuple[str, Callable[[Target], list[str]]], ...] = (
    ("the README's examples", readme_examples),
    ("a list with an empty item", list_with_an_empty_item),
    ("a sentence pair", a_pair),
    ("Open Inference Protocol (v2) over HTTP", open_inference_v2),
    ("Prometheus /metrics", prometheus_metrics),
)


@dataclass
class Container(EngineCalls):
    """One container of the image, named after this process, removed by ``remove``;
    ``http`` and ``metrics`` are the host ports its inference and metrics ports are
    published on."""

    engine: list[str]
    image: str
    name: str
    http: int
    metrics: int
    addresses: dict[str, str]
    limits: dict[str, str]

    @classmethod
    def of(cls, engine: list[str], image: str) -> Container:
        name = f"bert-serve-image-test-{os.getpid()}"
        addresses = container_addresses()
        return cls(engine, image, name, free_port(), free_port(), addresses, pod_limits())

    def sibling(self, suffix: str) -> Container:
        """Another container of the same image and limits, with ports of its own."""
        return replace(self, name=f"{self.name}-{suffix}", http=free_port(), metrics=free_port())

    def start(self, volumes: dict[Path, str] | None = None, measured: Path | None = None) -> None:
        inside_http = port_of(self.addresses["inference_address"])
        inside_metrics = port_of(self.addresses["metrics_address"])
        mounts = [f"{host}:{inside}:ro" for host, inside in (volumes or {}).items()]
        if measured is not None:
            measured.chmod(0o777)  # a start may measure what it lacks, as the image's user
            mounts.append(f"{measured}:{MEASURED_INSIDE}")
        mounted = [arg for mount in mounts for arg in ("--volume", mount)]
        self.run(
            "run", "--detach", "--name", self.name, *LIMITS, *mounted,
            "--cpus", self.limits["cpus"], "--memory", self.limits["memory"],
            "--publish", f"127.0.0.1:{self.http}:{inside_http}",
            "--publish", f"127.0.0.1:{self.metrics}:{inside_metrics}",
            self.image,
        )  # fmt: skip

    def state(self, field: str) -> str:
        return self.run("inspect", "--format", "{{.State." + field + "}}", self.name)

    def logs(self, tail: int | None = 40) -> str:
        return self.output("logs", *(["--tail", str(tail)] if tail else []), self.name)

    def probe_ready(self) -> bool:
        """The pod's readiness probe."""
        return self.succeeds("exec", self.name, *READY_PROBE)

    def target(self) -> Target:
        return Target(f"http://127.0.0.1:{self.http}", f"http://127.0.0.1:{self.metrics}")

    def remove(self) -> None:
        self.run("rm", "--force", self.name, check=False)


def workers_ready(container: Container) -> bool:
    """All workers READY, from the management API's description of the model."""
    try:
        status, text = management(container, container.name, "GET", "/models/bert")
        states = [worker["status"] for worker in json.loads(text)[0]["workers"]]
    except (RuntimeError, ValueError, LookupError, TypeError):
        return False
    return status == 200 and bool(states) and all(state == "READY" for state in states)


@dataclass
class Readiness:
    """Seconds from `run` until /ping answered Healthy, the readiness probe said ready, and
    every worker was READY; and how often the probe said not ready before."""

    ping_s: float | None = None
    probe_s: float | None = None
    ready_s: float | None = None
    probe_not_ready: int = 0


def answers(container: Container) -> bool:
    try:
        answer = requests.post(container.target().predict, json={"text": "A film."}, timeout=30)
    except requests.RequestException:
        return False
    return answer.status_code == 200


def healthy(ping_url: str) -> bool:
    try:
        response = requests.get(ping_url, timeout=5)
        return response.status_code == 200 and response.json().get("status") == "Healthy"
    except (requests.RequestException, ValueError):
        return False


def wait_ready(container: Container, started: float) -> Readiness:
    """Poll /ping, the pod's readiness probe and the workers until all say ready.

    /ping says Healthy as soon as the workers are started, before the model is loaded
    (and while a failing worker retries), so READY is read from the workers themselves. The
    probe must say not ready at least once while they load, and the model must answer as soon
    as it says ready.
    """
    url = f"{container.target().inference}/ping"
    seen = Readiness()
    while time.monotonic() - started < READY_TIMEOUT_S:
        if container.state("Running") != "true":
            raise ImageTestFailed(f"the container exited before READY:\n{container.logs()}")
        if seen.ping_s is None and healthy(url):
            seen.ping_s = time.monotonic() - started
        if seen.probe_s is None:
            if container.probe_ready():
                seen.probe_s = time.monotonic() - started
                if not answers(container):
                    raise ImageTestFailed(
                        "the readiness probe said ready; the model did not answer"
                    )
            else:
                seen.probe_not_ready += 1
        if seen.ping_s is not None and seen.probe_s is not None and workers_ready(container):
            seen.ready_s = time.monotonic() - started
            if seen.probe_not_ready == 0:
                raise ImageTestFailed("the readiness probe said ready before the workers loaded")
            return seen
        time.sleep(0.5)
    raise ImageTestFailed(f"not READY within {READY_TIMEOUT_S:.0f} s:\n{container.logs()}")


def mixed(n: int) -> Job:
    """The n-th request of a burst: a long text, a list and a pair in turn."""
    return Job(BURST_BODIES[n % len(BURST_BODIES)], "application/json")


def burst(predict_url: str) -> dict[str, int]:
    """A bounded burst of mixed requests: each status counted."""
    loop = ClosedLoop(
        predict_url, {}, mixed, BURST_CLIENTS, READY_TIMEOUT_S, BURST_REQUESTS, request_timeout_s=60
    ).run()
    return statuses(loop.outcomes)


def patient_clients(predict_url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """``PATIENT_CLIENTS`` clients that wait up to ``PATIENT_TIMEOUT_S`` for each answer and send
    again at once, for ``PATIENT_S``: every status counted."""
    loop = ClosedLoop(
        predict_url, headers or {}, lambda n: mixed(0), PATIENT_CLIENTS, PATIENT_S,
        request_timeout_s=PATIENT_TIMEOUT_S,
    ).run()  # fmt: skip
    setting = {"clients": PATIENT_CLIENTS, "seconds": PATIENT_S, "timeout_s": PATIENT_TIMEOUT_S}
    return setting | {"statuses": statuses(loop.outcomes)}


NOT_ACCEPTED = ("client_ClientConnectorError",)
"""A connection the stopped server refused: the request was never accepted."""


def stop_under_load(container: Container, grace_s: int) -> tuple[float, dict[str, int]]:
    """SIGTERM after ``STOP_AFTER_S`` of ``STOP_CLIENTS`` clients sending; clients send nothing
    new once it is sent. Seconds until the container exited, and every status counted."""
    stopped: list[float] = []
    url = container.target().predict
    loop = ClosedLoop(
        url, {}, mixed, STOP_CLIENTS, READY_TIMEOUT_S, request_timeout_s=PATIENT_TIMEOUT_S
    )

    async def stop() -> None:
        await asyncio.sleep(STOP_AFTER_S)
        # Clients stop sending first, then the signal goes from a thread: the engine's kill
        # command can take a second on a loaded machine, and run here it froze every client,
        # whose requests begun before the signal then reached the server only after it.
        loop.stopped = True
        stopped.append(await asyncio.to_thread(stop_within_grace, container, grace_s))

    loop.run(stop())
    return stopped[0], statuses(loop.outcomes)


def process_role(cmdline: str) -> str:
    """ "frontend" (TorchServe's Java), "worker" (a model worker), else the program's name."""
    if "org.pytorch.serve.ModelServer" in cmdline:
        return "frontend"
    if "model_service_worker" in cmdline:
        return "worker"
    return cmdline.split(" ", 1)[0].rsplit("/", 1)[-1]


def process_memory(process: psutil.Process) -> dict[str, Any]:
    """The process's role, RSS and PSS (shared pages split among their users) in MiB."""
    memory = process.memory_full_info()
    return {
        "pid": process.pid,
        "role": process_role(" ".join(process.cmdline())),
        "rss_mib": round(memory.rss / 2**20, 1),
        "pss_mib": round(memory.pss / 2**20, 1),
    }


def container_memory(container: Container) -> list[dict[str, Any]]:
    """Each of the container's processes as the host sees it (the engine runs them here)."""
    root = psutil.Process(int(container.state("Pid")))
    return [process_memory(process) for process in [root, *root.children(recursive=True)]]


def stop_within_grace(container: Container, grace_s: int) -> float:
    """SIGTERM to the container's main process; seconds until it exited (0 required)."""
    started = time.monotonic()
    container.run("kill", "--signal", "TERM", container.name)
    while container.state("Running") == "true":
        if time.monotonic() - started > grace_s:
            raise ImageTestFailed(f"still running {grace_s} s after SIGTERM:\n{container.logs()}")
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    code = container.state("ExitCode")
    if code != "0":
        raise ImageTestFailed(f"exit code {code} after SIGTERM:\n{container.logs()}")
    return elapsed


IN_CONTAINER_WAR = "/tmp/probe_wf.war"
IN_CONTAINER_MARKERS = "/tmp/probe-markers"


def workflow_refused(container: Container) -> list[str]:
    """A real workflow archive copied into the container is refused by POST /workflows, named
    as a file URL or a bare name, and its code never runs (docs/security.md)."""
    with tempfile.TemporaryDirectory() as scratch:
        archive = build_workflow_archive(Path(scratch), Path(IN_CONTAINER_MARKERS))
        container.run("cp", str(archive.path), f"{container.name}:{IN_CONTAINER_WAR}")
    found = []
    for url in (f"file://{IN_CONTAINER_WAR}", Path(IN_CONTAINER_WAR).name):
        query = f"/workflows?url={url}&workflow_name={WORKFLOW_NAME}"
        status, text = management(container, container.name, "POST", query)
        if status != 404:
            found.append(f"POST /workflows?url={url} answered {status}: {text[:200]}")
    ran = container.run("exec", container.name, "ls", "-A", "/tmp")
    if Path(IN_CONTAINER_MARKERS).name in ran.split():
        found.append("the workflow archive's code ran in the container")
    return found


# Run inside the image: which distributions of ours are installed, and which of our top-level
# packages can be imported (nothing but the server package may be).
INSTALLED_PACKAGES = """import importlib.metadata as m, importlib.util as u, json
ours = ("bert_serve_server", "bert_serve", "lab", "harness", "handler", "tests", "scripts")
print(json.dumps({
    "dists": sorted(d.metadata["Name"] for d in m.distributions() if d.metadata["Name"].startswith("bert")),
    "importable": sorted(name for name in ours if u.find_spec(name) is not None),
}))"""


def installed_packages(container: Container) -> list[str]:
    """The image installs the server package (server/) and nothing else of the checkout: no
    lab, no client, no tests, no loose copies of modules."""
    found = json.loads(
        container.run("exec", container.name, "python3.11", "-c", INSTALLED_PACKAGES)
    )
    dists, importable = found["dists"], found["importable"]
    return problems(
        (dists == ["bert-serve-server"], f"distributions: {dists}"),
        (importable == ["bert_serve_server"], f"importable: {importable}"),
    )


SERVER_COMMAND = ("python3.11", "-m", "bert_serve_server")
SERVER_VERBS = ("status", "models", "url", "predict-url")
"""The server package's commands that read a running server: each must work in the image, where
no handler/ is installed (``kubectl exec ... -- python3.11 -m bert_serve_server status``)."""


def server_commands(container: Container) -> list[str]:
    """Each of ``SERVER_VERBS`` run in the container exits 0 and prints something."""
    failed = []
    for verb in SERVER_VERBS:
        try:
            if not container.run("exec", container.name, *SERVER_COMMAND, verb):
                failed.append(f"{verb}: printed nothing")
        except RuntimeError as error:
            failed.append(f"{verb}: {error}")
    return failed


CONTAINER_CHECKS: tuple[tuple[str, Callable[[Container], list[str]]], ...] = (
    ("a workflow archive is refused and never runs", workflow_refused),
    ("the server package is installed, and no lab, client or test module", installed_packages),
    ("the server's commands work in the image: " + ", ".join(SERVER_VERBS), server_commands),
)


def run_checks(
    target: Any, checks: Sequence[tuple[str, Callable[[Any], list[str]]]] = CHECKS
) -> dict[str, list[str]]:
    """Every check's problems by its name, in order; a check that raised has that error as its
    problem, so one run reports every failure, not the first."""
    outcomes = {}
    for name, check in checks:
        try:
            outcomes[name] = check(target)
        except Exception as error:  # a failed request is this check's outcome too
            outcomes[name] = [f"{type(error).__name__}: {error}"]
    return outcomes


def run_image_test(
    image: str, engine: list[str], say: Callable[[str], None] = print, measured: Path | None = None
) -> dict[str, Any]:
    """Everything the module docstring lists, against one fresh container of ``image``;
    raises ImageTestFailed on the first step that fails (all request checks are run first)."""
    grace_s = grace_period_s()
    container = Container.of(engine, image)
    image_bytes = int(container.run("image", "inspect", "--format", "{{.Size}}", image))
    try:
        started = time.monotonic()
        say(f"start with the pod's limits {container.limits}, measurements from {measured}")
        container.start(measured=measured)
        seen = wait_ready(container, started)
        say(
            f"/ping Healthy after {seen.ping_s:.1f} s, the readiness probe ready after "
            f"{seen.probe_s:.1f} s (not ready {seen.probe_not_ready} times before), "
            f"READY after {seen.ready_s:.1f} s"
        )
        sizing = sizing_lines(container.logs(tail=None))
        for line in sizing:
            say(f"sizing: {line}")
        outcomes = run_checks(container.target()) | run_checks(container, CONTAINER_CHECKS)
        for name, found in outcomes.items():
            say(f"{'FAIL' if found else 'ok  '} {name}")
        if failed := [
            f"{name}: {problem}" for name, found in outcomes.items() for problem in found
        ]:
            raise ImageTestFailed("\n".join(failed))
        if container.engine[0] == "podman":
            say("health check")
            container.run("healthcheck", "run", container.name)
        say(f"burst of {BURST_REQUESTS}")
        counted = burst(container.target().predict)
        if counted != {"200": BURST_REQUESTS}:
            raise ImageTestFailed(f"burst: {counted}, not {BURST_REQUESTS} x 200")
        processes = container_memory(container)
        for process in processes:
            say(f"memory {process}")
        say(f"{PATIENT_CLIENTS} patient clients for {PATIENT_S:.0f} s")
        patient = patient_clients(container.target().predict)
        say(f"patient clients: {patient}")
        if set(patient["statuses"]) != {"200"}:
            raise ImageTestFailed(f"patient clients were refused: {patient['statuses']}")
        say(f"SIGTERM under the load of {STOP_CLIENTS} clients")
        stop_s, under_stop = stop_under_load(container, grace_s)
        lost = {k: n for k, n in under_stop.items() if k != "200" and k not in NOT_ACCEPTED}
        say(f"stopped with exit code 0 after {stop_s:.1f} s; requests: {under_stop}")
        if lost:
            raise ImageTestFailed(f"accepted requests lost at the stop: {lost}")
    finally:
        container.remove()
    unloadable = unloadable_start(container, say)
    return {
        "image": image,
        "limits": container.limits,
        "sized_from": sized_from(),
        "measured": "its own" if measured is None else f"carried in from {measured}",
        "image_bytes": image_bytes,
        "ping_s": round(seen.ping_s or 0, 1),
        "probe_ready_s": round(seen.probe_s or 0, 1),
        "probe_not_ready_polls": seen.probe_not_ready,
        "ready_s": round(seen.ready_s or 0, 1),
        "sizing": sizing,
        "stop_s": round(stop_s, 1),
        "grace_s": grace_s,
        "patient": patient,
        "under_stop": under_stop,
        "lost_under_stop": lost,
        "checks": list(outcomes),
        "processes": processes,
        "unloadable": unloadable,
    }


def sizing_lines(log: str) -> list[str]:
    """The lines a start printed in ``log`` about its sizing (``sizing: ...``), prefix removed."""
    lines = log.splitlines()
    return [line.removeprefix("sizing: ") for line in lines if line.startswith("sizing: ")]


def unloadable_archive(source: Path, out: Path) -> Path:
    """A copy of ``source`` whose model's config.json declares ``UNKNOWN_MODEL_TYPE``,
    readable by the image's user."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(out, "w") as copy:
        for info in original.infolist():
            data = original.read(info)
            if info.filename == "model/config.json":
                data = json.dumps(json.loads(data) | {"model_type": UNKNOWN_MODEL_TYPE}).encode()
            copy.writestr(info, data)
    out.chmod(0o644)
    return out


def unloadable_start(first: Container, say: Callable[[str], None]) -> dict[str, Any]:
    """A container whose archive's model cannot load: it must exit non-zero, and its log must
    hold the Python traceback of the loading and the cause; always removed."""
    container = first.sibling("unloadable")
    say(f"start with a model of type {UNKNOWN_MODEL_TYPE!r}, which cannot load")
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        archive = unloadable_archive(ARCHIVE_SOURCE, Path(folder, "bert.mar"))
        try:
            started = time.monotonic()
            container.start(volumes={archive: IMAGE_ARCHIVE})
            while container.state("Running") == "true":
                if time.monotonic() - started > READY_TIMEOUT_S:
                    raise ImageTestFailed(f"still running after {READY_TIMEOUT_S:.0f} s")
                time.sleep(1)
            exited_s = round(time.monotonic() - started, 1)
            exit_code, log = container.state("ExitCode"), container.logs(tail=200)
        finally:
            container.remove()
    lines = log.splitlines()
    tracebacks = [n for n, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    say(f"exited {exit_code} after {exited_s} s; traceback at log lines {tracebacks}")
    if exit_code in ("", "0") or not tracebacks or UNKNOWN_MODEL_TYPE not in log:
        raise ImageTestFailed(f"a model that cannot load: exit {exit_code!r}, log:\n{log[-3000:]}")
    cause = next(line for line in reversed(lines) if UNKNOWN_MODEL_TYPE in line)
    return {"exit_code": int(exit_code), "exited_s": exited_s, "cause": cause[:300]}


IMAGE_RECORD = ROOT / "deploy" / "image-test.json"
MEMORY_STEP_MIB = 256


def startup_budget_s(deployment: Path = DEPLOYMENT) -> int:
    """The TorchServe container's startup probe: ``periodSeconds x failureThreshold``."""
    probe = torchserve_container(deployment)["startupProbe"]
    return int(probe["periodSeconds"]) * int(probe["failureThreshold"])


def worker_mib(record: dict[str, Any]) -> int:
    """One worker's budgeted memory as the image record's start measured it."""
    for line in record["sizing"]:
        if match := re.search(r"a worker holds (\d+) MiB", line):
            return int(match.group(1))
    raise ValueError("the image record has no worker memory line")


def memory_for(models: int, worker: int) -> str:
    """The engine's ``--memory`` for ``models`` workers of ``worker`` MiB in half of it."""
    return f"{math.ceil(2 * models * worker / MEMORY_STEP_MIB) * MEMORY_STEP_MIB}m"


def models_start(
    engine: list[str], image: str, models: int, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """``image`` of ``models`` models started as the pod runs it (its CPUs, the startup probe
    run in the container as kubelet runs it), the probe's seconds against the Deployment's
    budget; always removed. Only the memory is not the pod's: the start keeps the workers
    within half of it, so ``memory_for`` gives what ``models`` workers of the image record's
    measured size need (three do not fit the Deployment's limit)."""
    budget_s, base = startup_budget_s(), Container.of(engine, image)
    memory = memory_for(models, worker_mib(json.loads(IMAGE_RECORD.read_text())))
    container = replace(base, limits=base.limits | {"memory": memory})
    say(f"start with {container.limits}; the startup probe's budget is {budget_s} s")
    try:
        container.start()
        ready_s = wait_started(
            lambda: container.succeeds("exec", container.name, *STARTUP_PROBE),
            budget_s,
            lambda: container.logs(200),
            lambda: container.state("Running") == "true",
        )
        status, text = management(container, container.name, "GET", "/models")
        served = sorted(model["modelName"] for model in json.loads(text)["models"])
        sizing = sizing_lines(container.logs(tail=None))
    finally:
        container.remove()
    say(f"startup probe passed after {ready_s} s: {served}")
    if status != 200 or len(served) != models:
        raise ImageTestFailed(f"{models} models asked for, {served} served")
    found = {"image": image, "limits": container.limits, "models": served, "ready_s": ready_s}
    return found | {"startup_budget_s": budget_s, "sizing": sizing, "sized_from": sized_from()}


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("image-test", __doc__)
    parser.add_argument("--image", default=os.environ.get("IMAGE", "bert-serve:0.1.0"))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "image" / "image-test.json")
    parser.add_argument("--models", type=int, help="models-start: how many the image serves")
    parser.add_argument("--measured", type=Path, help="start on these measurements")
    args = parser.parse_args(argv)
    engine = engine_command()
    if args.models:
        started = partial(models_start, engine, args.image, args.models)
        return recorded("models-start", args.out, started)
    return recorded(
        "image-test", args.out, lambda say: run_image_test(args.image, engine, say, args.measured)
    )
