"""``make pod-test``: the whole Deployment as one pod, ``podman kube play`` of
deploy/k8s/deployment.yaml as written (both containers, limits, the proxy's ConfigMap, the key
from a Secret, read-only roots), through the proxy with the key, against deploy/README.md's
bars: 256 patient clients never refused; a killed frontend ends its container, which is
restarted and ready again; SIGTERM while clients keep opening new connections (as kubelet
sends it): none refused, every container exits 0 within the grace period; the same with every
sizing value stated (``STATED_ENV``: 2 workers), run and said. With ``--keep-measured DIR``,
what the first pod's start measured is copied into DIR once it is ready (``image-test
--measured DIR`` starts on it).

What podman needs that a cluster has: an infra image where catatonit is absent, ulimits that
fit (a containers.conf of the run's own), the Secret as a podman secret of base64 values. Names
carry the run's tag, so runs beside each other do not meet.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from bert_serve_server.config import ROOT, free_port

from lab.image import (
    DEPLOYMENT,
    MEASURED_INSIDE,
    PATIENT_CLIENTS,
    PATIENT_TIMEOUT_S,
    READY_TIMEOUT_S,
    STARTUP_PROBE,
    STATED_ENV,
    EngineCalls,
    ImageTestFailed,
    engine_command,
    grace_period_s,
    management,
    mixed,
    patient_clients,
    pod_spec,
    recorded,
    sizing_lines,
    wait_started,
)
from lab.load import ClosedLoop, statuses
from lab.report import tool_parser

K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
NEW_CONNECTION_CLIENTS = 16
NEW_CONNECTIONS_S = 6.0
"""How long clients keep opening new connections after SIGTERM: more than the bar's 5 s, less
than the proxy's stop delay (10 s), so every one of them must be accepted."""
SIGTERM_AFTER_S = 2.0
APP_CONTAINERS = ("torchserve", "proxy")
ULIMITS = ("nofile=1024:1024", "nproc=1024:1024")
"""What lab/image.py's runs use on this machine: within its hard limits."""
PAUSE = '#!/bin/sh\ntrap "exit 0" TERM INT\nwhile :; do sleep 3600 & wait $!; done\n'
EXITED_UNASKED = "exited without a stop being asked"
"""deploy/entrypoint.sh's line before it exits 1."""
BASES = ("localhost/bookworm-minbase:12", "debian:bookworm-slim")
"""The bases scripts/image.sh builds on: its debootstrap'd minbase where no registry answers."""


MEASURED = (
    "deploy/entrypoint.sh",
    "deploy/k8s/deployment.yaml",
    "deploy/k8s/proxy/bert-serve.conf",
    "deploy/proxy/entrypoint.sh",
    "deploy/proxy/nginx.conf",
    "server/bert_serve_server/ready.py",
)
"""What the record's figures depend on besides the images' packages: its ``measured_from``."""


def measured_from(root: Path = ROOT) -> str:
    """The hash of ``MEASURED``: what a record's figures were measured on. A manifest counts
    by its content, not its comments (deployment.yaml's carry the image record's figures)."""
    digest = hashlib.sha256()
    for name in MEASURED:
        path = root / name
        if path.suffix == ".yaml":
            content = json.dumps(list(yaml.safe_load_all(path.read_text())), sort_keys=True)
            digest.update(content.encode())
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()


def config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def container_limits(deployment: Path = DEPLOYMENT) -> dict[str, dict[str, str]]:
    """Each container's resource limits, as the Deployment writes them."""
    return {c["name"]: dict(c["resources"]["limits"]) for c in pod_spec(deployment)["containers"]}


def kube_documents(
    tag: str,
    images: dict[str, str],
    host_ports: dict[str, int],
    stated: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """deployment.yaml as podman kube plays it here: one replica, names with ``tag``, the
    containers' images from ``images`` (by container name), ``host_ports`` (by port name) on
    127.0.0.1, and ``stated`` added to TorchServe's environment. Everything else as written."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    deployment["metadata"]["name"] = f"bert-serve-{tag}"
    deployment["spec"]["replicas"] = 1
    spec = deployment["spec"]["template"]["spec"]
    # A Deployment's pods restart every container that exits (Always), except while the pod
    # terminates; podman would restart them then too. OnFailure restarts a crash (the killed
    # frontend's exit 1) and leaves a container that stopped cleanly stopped, as kubelet does.
    spec["restartPolicy"] = "OnFailure"
    # The proxy's ConfigMap as kustomization.yaml's configMapGenerator makes it (without the
    # content hash kustomize appends to the name, which it also writes into the Deployment).
    (generator,) = yaml.safe_load(KUSTOMIZATION.read_text())["configMapGenerator"]
    files = {Path(name).name: (K8S / name).read_text() for name in generator["files"]}
    documents = [config_map(f"{generator['name']}-{tag}", files)]
    for volume in spec["volumes"]:
        if "configMap" in volume:
            volume["configMap"]["name"] = documents[0]["metadata"]["name"]
    for container in spec["containers"]:
        container["image"] = images[container["name"]]
        for port in container.get("ports", []):
            if port.get("name") in host_ports:
                port["hostPort"] = host_ports[port["name"]]
                port["hostIP"] = "127.0.0.1"
        for entry in container.get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                ref["name"] = f"{ref['name']}-{tag}"
        if container["name"] == "torchserve":
            container["env"] += [{"name": k, "value": v} for k, v in (stated or {}).items()]
    return [*documents, deployment]


def secret_content(values: dict[str, str]) -> str:
    """A podman secret's content that podman 4.3's kube play reads as a Secret's data."""
    return json.dumps(
        {key: base64.b64encode(value.encode()).decode() for key, value in values.items()}
    )


def containers_conf(infra_image: str | None) -> str:
    """containers.conf for the run: ulimits that fit this machine, and the infra image where
    podman cannot make its own (no catatonit)."""
    text = "[containers]\ndefault_ulimits = [" + ", ".join(f'"{u}"' for u in ULIMITS) + "]\n"
    if infra_image:
        text += f'[engine]\ninfra_image = "{infra_image}"\ninfra_command = "/pause"\n'
    return text


def secret_name(tag: str) -> str:
    ref = next(
        entry["valueFrom"]["secretKeyRef"]
        for container in pod_spec()["containers"]
        for entry in container.get("env", [])
        if "valueFrom" in entry
    )
    return f"{ref['name']}-{tag}"


@dataclass
class Pod(EngineCalls):
    """One ``podman kube play`` of the Deployment, its files in ``state``."""

    engine: list[str]
    tag: str
    state: Path
    images: dict[str, str]
    stated: dict[str, str] | None = None
    key: str = field(default_factory=lambda: secrets.token_hex(32))
    ports: dict[str, int] = field(
        default_factory=lambda: {"proxy": free_port(), "metrics": free_port()}
    )
    env: dict[str, str] | None = None

    @property
    def name(self) -> str:
        return f"bert-serve-{self.tag}-pod-0"

    def container(self, name: str) -> str:
        return f"{self.name}-{name}"

    def play(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        manifest = self.state / "pod.yaml"
        manifest.write_text(
            yaml.safe_dump_all(kube_documents(self.tag, self.images, self.ports, self.stated))
        )
        secret = self.state / "secret.json"
        secret.write_text(secret_content({"key": self.key}))
        self.run("secret", "rm", secret_name(self.tag), check=False)
        self.run("secret", "create", secret_name(self.tag), str(secret))
        self.run("kube", "play", "--replace", str(manifest), timeout=300)

    def state_of(self, container: str, field_name: str) -> str:
        return self.run(
            "inspect", "--format", f"{{{{.State.{field_name}}}}}", self.container(container)
        )

    def logs(self, container: str) -> str:
        return self.output("logs", self.container(container))

    def remove(self) -> None:
        self.run("pod", "rm", "--force", "--time", "0", self.name, check=False, timeout=180)
        self.run("secret", "rm", secret_name(self.tag), check=False)

    @property
    def predict(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy']}/predictions/bert"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@contextmanager
def played(pod: Pod) -> Iterator[Pod]:
    """``pod`` played, and removed at the block's end (or where the play failed)."""
    try:
        pod.play()
        yield pod
    finally:
        pod.remove()


def wait_ready(pod: Pod, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds until the startup probe's command says every worker READY."""
    probe = ("exec", pod.container("torchserve"), *STARTUP_PROBE)
    return wait_started(
        lambda: pod.succeeds(*probe), timeout_s, lambda: pod.logs("torchserve")[-4000:]
    )


def patient(pod: Pod) -> dict[str, Any]:
    """``patient_clients`` through the proxy; a refusal fails with the start's queue sizing."""
    result = patient_clients(pod.predict, pod.headers)
    if set(result["statuses"]) != {"200"}:
        queue = [line for line in sizing_lines(pod.logs("torchserve")) if "queue" in line]
        raise ImageTestFailed(
            f"patient clients through the proxy got {result['statuses']}; " + "; ".join(queue)
        )
    return result


def stated_outcome(status: int, description: str, log: str) -> dict[str, Any]:
    """What a start with ``STATED_ENV`` runs (``status`` and ``description`` of the model from
    the management API) and says (its ``stated: ... (VARIABLE)`` sizing lines in ``log``);
    ImageTestFailed where it runs other than stated or leaves a variable unsaid."""
    if status != 200:
        raise ImageTestFailed(f"the management API answered {status}: {description[:300]}")
    (model,) = json.loads(description)
    running = {"workers": len(model["workers"]), "batchSize": model["batchSize"]}
    wanted = {"workers": int(STATED_ENV["BERT_SERVE_WORKERS"])}
    wanted["batchSize"] = int(STATED_ENV["BERT_SERVE_BATCH_SIZE"])
    said = [line for line in sizing_lines(log) if line.startswith("stated: ")]
    unsaid = [name for name in STATED_ENV if not any(f"({name})" in line for line in said)]
    if running != wanted or unsaid:
        raise ImageTestFailed(
            f"stated {STATED_ENV}: ran {running} (not {wanted}), not said: {unsaid}"
        )
    return {"env": STATED_ENV} | running | {"said": said}


def stated_running(pod: Pod) -> dict[str, Any]:
    """``stated_outcome`` of the pod's TorchServe container, read inside it."""
    status, text = management(pod, pod.container("torchserve"), "GET", "/models/bert")
    return stated_outcome(status, text, pod.logs("torchserve"))


def stop_under_new_connections(pod: Pod, grace_s: int) -> dict[str, Any]:
    """SIGTERM to the pod's containers after ``SIGTERM_AFTER_S`` of clients opening a new
    connection for each request, which go on for ``NEW_CONNECTIONS_S`` after it: as kubelet
    stops a pod, ``stop_as_kubelet``. The stop runs in a thread: the clients' loop never waits."""
    seconds, sent = SIGTERM_AFTER_S + NEW_CONNECTIONS_S, []
    load = ClosedLoop(
        pod.predict, pod.headers, lambda n: mixed(0), NEW_CONNECTION_CLIENTS, seconds,
        request_timeout_s=PATIENT_TIMEOUT_S, new_connections=True,
    )  # fmt: skip

    async def stop() -> None:
        await asyncio.sleep(SIGTERM_AFTER_S)
        sent.append(time.monotonic())
        await asyncio.to_thread(stop_as_kubelet, pod, grace_s)

    counted = statuses(load.run(stop()).outcomes)
    stop_s = round(time.monotonic() - sent[0], 1)  # the stop and the clients both done
    exits = {name: pod.state_of(name, "ExitCode") for name in APP_CONTAINERS}
    result = {"statuses": counted, "stop_s": stop_s, "exit_codes": exits}
    if set(counted) != {"200"} or any(code != "0" for code in exits.values()) or stop_s > grace_s:
        raise ImageTestFailed(f"the stop under new connections: {result}")
    return result


def stop_as_kubelet(pod: Pod, grace_s: int) -> None:
    """SIGTERM to every app container at once; SIGKILL to those still running after the grace
    period; the sandbox (podman's infra container, which holds the pod's network) after they
    all exited. Not ``podman pod stop``, which stops the infra container at once with the
    others and so takes the network down under the requests in flight (each then hung until
    its client gave up), and not ``podman stop``: a kube-played pod's exit policy (stop) takes
    a container in the Stopping state for exited, and stops the pod once the proxy has
    exited, TorchServe killed 10 s later while it still drains. (A container that exits 0 is
    not restarted: ``kube_documents``' restart policy.)"""
    apps = [pod.container(name) for name in APP_CONTAINERS]
    pod.run("kill", "--signal", "TERM", *apps)
    deadline = time.monotonic() + grace_s
    while any(pod.state_of(name, "Running") == "true" for name in APP_CONTAINERS):
        if time.monotonic() > deadline:
            pod.run("kill", "--signal", "KILL", *apps, check=False)
            break
        time.sleep(0.5)
    pod.run("pod", "stop", "--time", "10", pod.name, timeout=120)


def kill_frontend(pod: Pod) -> dict[str, Any]:
    """SIGKILL to the Java frontend (its pid file, in the home folder): the container exits
    non-zero (the entrypoint says so in its log) and, as a Deployment's pod, is restarted and
    becomes ready again."""
    kill = 'kill -KILL "$(cat "$HOME/tmp/.model_server.pid")"'
    killed = pod.succeeds("exec", pod.container("torchserve"), "sh", "-c", kill)
    deadline = time.monotonic() + 60
    while killed and time.monotonic() < deadline:
        if EXITED_UNASKED in pod.logs("torchserve"):
            break
        time.sleep(1)
    else:
        raise ImageTestFailed(f"the killed frontend did not end the container: killed={killed}")
    ready_again_s = wait_ready(pod)
    # read once ready again: right after the exit, the restart may not have come yet
    restarts = int(
        pod.run("inspect", "--format", "{{.RestartCount}}", pod.container("torchserve")) or 0
    )
    return {
        "exit": "1 (the entrypoint's line)",
        "restarts": restarts,
        "ready_again_s": ready_again_s,
    }


def infra_image(engine: list[str], tag: str, state: Path) -> str | None:
    """None where podman makes its own infra image (from Debian's catatonit); else one built
    for the run on the base scripts/image.sh built on: a shell that waits and exits on SIGTERM."""
    folders = ("/usr/libexec/podman", "/usr/bin", "/usr/local/libexec/podman")
    if any(Path(folder, "catatonit").exists() for folder in folders):
        return None
    base = BASES[-1]
    for built in BASES[:-1]:
        if subprocess.run([*engine, "image", "exists", built], capture_output=True).returncode == 0:
            base = built
            break
    name, context = f"localhost/bert-serve-pause:{tag}", state / "pause"
    context.mkdir(parents=True, exist_ok=True)
    (context / "pause").write_text(PAUSE)
    (context / "Containerfile").write_text(
        f'FROM {base}\nCOPY pause /pause\nRUN chmod 755 /pause\nENTRYPOINT ["/pause"]\n'
    )
    build = [*engine, "build", "--network", "none", "-t", name, str(context)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    return name


def run_pod_test(
    images: dict[str, str], say: Callable[[str], None], keep_measured: Path | None = None
) -> dict[str, Any]:
    engine, tag, grace_s = engine_command(), f"t{os.getpid()}", grace_period_s(DEPLOYMENT)
    state = ROOT / "build" / "pod" / tag
    record: dict[str, Any] = {"images": images, "limits": container_limits(), "grace_s": grace_s}
    state.mkdir(parents=True, exist_ok=True)
    infra = infra_image(engine, tag, state)
    (state / "containers.conf").write_text(containers_conf(infra))
    env = dict(os.environ) | {"CONTAINERS_CONF": str(state / "containers.conf")}
    try:
        say("kube play: the Deployment as written")
        with played(Pod(engine, tag, state / "one-worker", images, env=env)) as pod:
            record["ready_s"] = wait_ready(pod)
            if keep := keep_measured:  # once ready: every measurement made
                keep.mkdir(parents=True, exist_ok=True)
                pod.run("cp", f"{pod.container('torchserve')}:{MEASURED_INSIDE}/.", str(keep))
            say(f"ready after {record['ready_s']} s; {PATIENT_CLIENTS} patient clients")
            record["patient"] = patient(pod)
            say("killing the frontend")
            record["frontend_killed"] = kill_frontend(pod)
            say("SIGTERM while clients open new connections")
            record["stop"] = stop_under_new_connections(pod, grace_s)
        say(f"kube play with 2 workers stated: {STATED_ENV}")
        two = Pod(engine, f"{tag}-w2", state / "two-workers", images, STATED_ENV, env=env)
        with played(two) as pod:
            record["two_workers"] = {"ready_s": wait_ready(pod), "stated": stated_running(pod)}
            say("SIGTERM while clients open new connections, 2 workers")
            record["two_workers"]["stop"] = stop_under_new_connections(pod, grace_s)
    finally:
        if infra is not None:  # the run's own tag: no other run uses it
            subprocess.run([*engine, "rmi", infra], capture_output=True, timeout=120, check=False)
    return record | {"measured_from": measured_from()}


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("pod-test", __doc__)
    parser.add_argument("--image", default=os.environ.get("IMAGE", "bert-serve:0.1.0"))
    parser.add_argument(
        "--proxy-image", default=os.environ.get("PROXY_IMAGE", "bert-serve-proxy:0.1.0")
    )
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "image" / "pod-test.json")
    parser.add_argument("--keep-measured", type=Path, help="copy the first pod's measurements here")
    args = parser.parse_args(argv)
    images = {"torchserve": args.image, "proxy": args.proxy_image}
    return recorded("pod-test", args.out, lambda say: run_pod_test(images, say, args.keep_measured))
