"""The deployment files: Kubernetes schemas, and agreement with the config they ship.

Nothing here needs a cluster or a Docker engine: the plain manifests are checked against
the Kubernetes OpenAPI schemas that kubernetes-validate ships, and every port, path and
batch setting in deploy/ is compared with the layout scripts/deploy_layout.py generates.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from harness import layout as deploy_layout
from harness.config import BASE_CONFIG, log_config_path, read_properties
from tests.conftest import MAR_PATH, ROOT

KUBERNETES_VERSION = "1.30.0"
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> dict[str, Any]:
    found = [doc for path in MANIFESTS for doc in documents(path) if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/k8s, found {len(found)}"
    return found[0]


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    return deploy_layout.write_layout(tmp_path_factory.mktemp("deploy") / "layout")


@pytest.fixture(scope="module")
def layout_config(layout: Path) -> dict[str, str]:
    return read_properties(layout / "config" / "config.properties")


@pytest.fixture(scope="module")
def container() -> dict[str, Any]:
    containers = by_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def named_port(container: dict[str, Any], name: str) -> int:
    for entry in container["ports"]:
        if entry.get("name") == name:
            return int(entry["containerPort"])
    raise AssertionError(f"container has no port named {name!r}")


@pytest.mark.parametrize("path", MANIFESTS, ids=[path.name for path in MANIFESTS])
def test_manifests_match_the_kubernetes_schemas(path: Path) -> None:
    """Every plain manifest is valid for Kubernetes 1.30 in strict mode (no unknown fields)."""
    for document in documents(path):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """Guards the test above: a typo in a probe's name must not pass as valid."""
    deployment = copy.deepcopy(by_kind("Deployment"))
    spec = deployment["spec"]["template"]["spec"]["containers"][0]
    spec["readinesProbe"] = spec.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_kserve_predictor_container_is_a_valid_container() -> None:
    """The InferenceService's container fields (all but KServe's own) are a valid core Container."""
    model = dict(
        documents(DEPLOY / "kserve" / "inferenceservice.yaml")[0]["spec"]["predictor"]["model"]
    )
    for key in ("modelFormat", "protocolVersion", "storageUri", "runtime"):
        model.pop(key, None)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kserve-predictor"},
        "spec": {"containers": [{"name": "kserve-container", **model}]},
    }
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_probes_hit_ping_on_the_inference_port(
    container: dict[str, Any], layout_config: dict[str, str]
) -> None:
    """Kubelet probes /ping on the port TorchServe's inference API binds, with no token."""
    assert named_port(container, "http") == port(layout_config["inference_address"])
    assert named_port(container, "metrics") == port(layout_config["metrics_address"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        http_get = container[probe]["httpGet"]
        assert http_get["path"] == "/ping", probe
        assert http_get["port"] == "http", probe
    assert layout_config["disable_token_authorization"] == "true"
    annotations = by_kind("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == port(layout_config["metrics_address"])


def test_startup_probe_allows_the_model_startup_timeout(container: dict[str, Any]) -> None:
    """Liveness must not kill a pod that is still loading within TorchServe's own bound."""
    model_config = yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= model_config["startupTimeout"]


def test_service_hpa_and_deployment_fit_together(container: dict[str, Any]) -> None:
    deployment = by_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    service = by_kind("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    for entry in service["spec"]["ports"]:
        assert named_port(container, entry["targetPort"]) == entry["port"]
    target = by_kind("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == int(dockerfile_instruction("USER")[-1])


def dockerfile_instruction(name: str) -> list[str]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        line.split(None, 1)[1].strip()
        for line in text.splitlines()
        if line.strip().upper().startswith(name + " ")
    ]


def test_dockerfile_base_image_is_pinned_to_our_torchserve() -> None:
    """FROM the official image at the TorchServe version we test with, never :latest."""
    (from_line,) = dockerfile_instruction("FROM")
    base = from_line
    match = re.fullmatch(r"\$\{(\w+)\}", from_line)
    if match:
        args = dict(arg.split("=", 1) for arg in dockerfile_instruction("ARG") if "=" in arg)
        base = args[match.group(1)]
    image, _, tag = base.partition(":")
    assert image == "pytorch/torchserve"
    assert tag == f"{importlib.metadata.version('torchserve')}-cpu"


def test_dockerfile_copies_what_the_layout_contains(
    layout: Path, layout_config: dict[str, str]
) -> None:
    """Each COPY source exists in the build context the layout script writes, and the
    entrypoint points at the config and model store that layout's config names."""
    for copy_line in dockerfile_instruction("COPY"):
        source, destination = copy_line.split()[-2:]
        assert (layout / source).exists(), f"COPY {source}: not in the layout"
        if source != "requirements.txt":
            assert destination == f"{deploy_layout.MOUNT}/{source}"
    exposed = {int(value) for line in dockerfile_instruction("EXPOSE") for value in line.split()}
    assert exposed == {port(layout_config[key]) for key in deploy_layout.PUBLIC_KEYS}
    entrypoint = json.loads(dockerfile_instruction("ENTRYPOINT")[0])
    assert entrypoint[entrypoint.index("--model-store") + 1] == layout_config["model_store"]
    assert entrypoint[entrypoint.index("--ts-config") + 1] == (
        f"{deploy_layout.MOUNT}/config/config.properties"
    )


def test_layout_keeps_batching_and_limits_single_sourced(layout_config: dict[str, str]) -> None:
    """Only addresses, paths and token auth differ from config/config.properties."""
    base = read_properties(BASE_CONFIG)
    rewritten = {*deploy_layout.PUBLIC_KEYS, "model_store", "metrics_config", "vmargs"}
    for key, value in base.items():
        if key in rewritten or key in deploy_layout.DROPPED_KEYS:
            continue
        assert layout_config[key] == value, key
    assert json.loads(layout_config["models"]) == json.loads(base["models"])
    for key in deploy_layout.PUBLIC_KEYS:
        assert layout_config[key] == f"http://0.0.0.0:{port(base[key])}"
    assert layout_config["management_address"].startswith("http://127.0.0.1:")
    assert layout_config["model_store"] == "/mnt/models/model-store"


def test_layout_files(layout: Path, layout_config: dict[str, str]) -> None:
    """The KServe layout: config/config.properties, its metrics yaml, model-store/bert.mar."""
    metrics = Path(layout_config["metrics_config"])
    assert metrics.parent == Path(deploy_layout.MOUNT) / "config"
    assert (layout / "config" / metrics.name).read_bytes() == (
        ROOT / "config" / "metrics.yaml"
    ).read_bytes()
    assert (layout / "model-store" / "bert.mar").stat().st_size == MAR_PATH.stat().st_size
    log_config = log_config_path(layout_config["vmargs"])
    assert log_config == Path(deploy_layout.MOUNT) / "config" / "log4j2.xml"
    assert (layout / "config" / log_config.name).read_bytes() == (
        ROOT / "config" / "log4j2.xml"
    ).read_bytes()
    pins = dict(line.split("==") for line in (layout / "requirements.txt").read_text().splitlines())
    assert set(pins) == set(deploy_layout.RUNTIME_PACKAGES)
    for name, version in pins.items():
        assert importlib.metadata.version(name).split("+")[0] == version


def test_inference_service_matches_the_layout_and_deployment(
    container: dict[str, Any], layout_config: dict[str, str]
) -> None:
    (isvc,) = documents(DEPLOY / "kserve" / "inferenceservice.yaml")
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "pytorch"
    assert "REPLACE" in model["storageUri"], "the bucket is a placeholder and must say so"
    assert model["image"] == container["image"]
    assert model["resources"] == container["resources"]
    assert [entry["containerPort"] for entry in model["ports"]] == [
        port(layout_config["inference_address"])
    ]
    assert f"--model-store={layout_config['model_store']}" in model["args"]
    assert f"--ts-config={deploy_layout.MOUNT}/config/config.properties" in model["args"]
    assert "--foreground" in model["args"]
