"""lab/pod.py's pure steps: the Deployment as podman kube plays it (as written but for names,
images and host ports), the Secret's podman form, containers.conf, the stated workers."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from bert_serve_server.config import ROOT

from lab import pod
from lab.image import STATED_ENV, ImageTestFailed, container_addresses
from tests.unit.test_deploy import by_kind

IMAGES = {"torchserve": "bert-serve:t", "proxy": "bert-serve-proxy:t"}


def test_the_pod_is_the_deployment_as_written_with_names_images_and_ports_of_its_own() -> None:
    configmap, deployment = pod.kube_documents("t1", IMAGES, {"proxy": 41000, "metrics": 41001})
    written = by_kind("Deployment")
    spec, original = deployment["spec"]["template"]["spec"], written["spec"]["template"]["spec"]
    assert deployment["metadata"]["name"] == "bert-serve-t1" and deployment["spec"]["replicas"] == 1
    for container, source in zip(spec["containers"], original["containers"], strict=True):
        assert container["image"] == IMAGES[container["name"]]
        for key in ("resources", "securityContext", "startupProbe", "volumeMounts", "args"):
            assert container.get(key) == source.get(key), (container["name"], key)
    ports = {p["name"]: p for c in spec["containers"] for p in c.get("ports", [])}
    assert ports["proxy"]["hostPort"] == 41000 and ports["metrics"]["hostPort"] == 41001
    assert spec["terminationGracePeriodSeconds"] == original["terminationGracePeriodSeconds"]
    assert "restartPolicy" not in original and spec["restartPolicy"] == "OnFailure"
    assert (
        configmap["kind"] == "ConfigMap" and configmap["metadata"]["name"] == "bert-serve-proxy-t1"
    )
    assert "${BERT_SERVE_PROXY_KEY}" in configmap["data"]["bert-serve.conf"]
    (volume,) = [v for v in spec["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == "bert-serve-proxy-t1"
    env = {e["name"]: e for c in spec["containers"] for e in c.get("env", [])}
    ref = env["BERT_SERVE_PROXY_KEY"]["valueFrom"]["secretKeyRef"]
    assert (
        ref == {"name": "bert-serve-proxy-key-t1", "key": "key"}
        and pod.secret_name("t1") == ref["name"]
    )
    yaml.safe_dump_all([configmap, deployment])


def test_two_workers_are_stated_in_torchserves_environment() -> None:
    """The second pod states every sizing value: TorchServe's container gets every
    ``STATED_ENV`` variable, after those the Deployment sets."""
    _, deployment = pod.kube_documents("t2", IMAGES, {}, STATED_ENV)
    (torchserve,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "torchserve"
    ]
    written = by_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    (original,) = [c for c in written if c["name"] == "torchserve"]
    stated = [{"name": name, "value": value} for name, value in STATED_ENV.items()]
    assert torchserve["env"] == original["env"] + stated
    assert torchserve.get("args") == original.get("args")


def stated_log(names: list[str]) -> str:
    """A start's log that says each of ``names`` was stated, as deploy/entrypoint.sh does."""
    lines = [f"sizing: stated: {name.lower()} {STATED_ENV[name]} ({name})" for name in names]
    return "\n".join(["starting", *lines, "sizing: queue 64"])


def described(workers: int, batch_size: int) -> str:
    """The management API's description of the model: ``workers`` READY, ``batch_size``."""
    return json.dumps([{"workers": [{"status": "READY"}] * workers, "batchSize": batch_size}])


def test_a_pod_that_runs_and_says_what_was_stated_passes() -> None:
    got = pod.stated_outcome(200, described(2, 4), stated_log(list(STATED_ENV)))
    assert (got["workers"], got["batchSize"], got["env"]) == (2, 4, STATED_ENV)
    assert len(got["said"]) == len(STATED_ENV) and got["said"][0].startswith("stated: ")


@pytest.mark.parametrize(
    ("status", "description", "names", "problem"),
    [
        (200, described(1, 4), list(STATED_ENV), r"ran \{'workers': 1, 'batchSize': 4\}"),
        (200, described(2, 8), list(STATED_ENV), r"'batchSize': 8\} \(not"),
        (200, described(2, 4), list(STATED_ENV)[1:], r"not said: \['BERT_SERVE_WORKERS'\]"),
        (404, '{"code": 404}', list(STATED_ENV), "the management API answered 404"),
    ],
)
def test_a_pod_that_runs_other_than_stated_or_leaves_a_setting_unsaid_fails(
    status: int, description: str, names: list[str], problem: str
) -> None:
    with pytest.raises(ImageTestFailed, match=problem):
        pod.stated_outcome(status, description, stated_log(names))


class ManagedPod:
    """A pod whose TorchServe container answers the management request with ``answer``."""

    container = pod.Pod.container
    name = "bert-serve-t3-pod-0"

    def __init__(self, answer: str) -> None:
        self.answer, self.calls = answer, []

    def run(self, *args: str, timeout: float = 120) -> str:
        self.calls.append(args)
        return self.answer

    def logs(self, container: str) -> str:
        assert container == "torchserve"
        return stated_log(list(STATED_ENV))


def test_the_stated_pod_is_read_inside_its_torchserve_container() -> None:
    """The management API listens inside the container only: the pod test reads the model's
    description there, at the image's management address."""
    managed = ManagedPod("200\n" + described(2, 4))
    assert pod.stated_running(managed)["workers"] == 2  # type: ignore[arg-type]
    ((verb, container, python, _, _, method, path, body, base),) = managed.calls
    assert (verb, container, python) == ("exec", "bert-serve-t3-pod-0-torchserve", "python3.11")
    assert (method, path, body) == ("GET", "/models/bert", "")
    assert base == container_addresses()["management_address"]


def test_the_secret_is_a_json_map_of_base64_values_and_the_ulimits_fit() -> None:
    content = json.loads(pod.secret_content({"key": "k3y_x"}))
    assert base64.b64decode(content["key"]).decode() == "k3y_x"
    conf = pod.containers_conf("localhost/pause:t")
    assert 'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]' in conf
    assert 'infra_image = "localhost/pause:t"' in conf
    assert "infra_image" not in pod.containers_conf(None)


def test_the_record_hash_follows_the_manifest_not_its_comments(tmp_path: Path) -> None:
    """deployment.yaml's comments carry the image record's figures: rewriting them must not
    make the pod record stale; a changed value must."""
    for name in pod.MEASURED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    before = pod.measured_from(tmp_path)
    manifest = tmp_path / "deploy" / "k8s" / "deployment.yaml"
    manifest.write_text(manifest.read_text().replace("# ", "# figures of another run: ", 1))
    assert pod.measured_from(tmp_path) == before
    manifest.write_text(
        manifest.read_text().replace(
            "terminationGracePeriodSeconds: 90", "terminationGracePeriodSeconds: 91"
        )
    )
    assert pod.measured_from(tmp_path) != before
