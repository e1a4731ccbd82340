"""The KServe manifests (deploy/kserve/) against KServe's own CRD schemas, and the
InferenceService naming the runtime it ships, never relying on modelFormat auto-selection.

The CRDs are in ../shared/kserve/ beside the repository (copied unchanged from kserve/kserve;
its README names the commit). Validation is strict, as `kubectl apply --validate=strict`:
a field the schema does not name is an error, so a misspelt key cannot pass as valid.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import ROOT

KSERVE = ROOT / "deploy" / "kserve"
CRDS = ROOT.parent / "shared" / "kserve"
MANIFESTS = sorted(KSERVE.glob("*.yaml"))
RUNTIME_KINDS = ("ServingRuntime", "ClusterServingRuntime")
# KServe's protocol names (pkg/constants: ProtocolV1, ProtocolV2, ProtocolGRPCV1, ProtocolGRPCV2)
PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
COMPONENTS = ("predictor", "transformer", "explainer")
# KServe's container names (pkg/constants: InferenceServiceContainerName, the model server, and
# TransformerContainerName, the one in front of it in the same pod, whose port Standard mode's
# Service targets)
MODEL_SERVER, IN_FRONT = "kserve-container", "transformer-container"
# Knative's ports a container may not take (pkg/apis/serving/k8s_validation.go: the
# queue-proxy's HTTP, HTTP/2, admin and metrics ports and the profiler's) and port names
KNATIVE_RESERVED_PORTS = {8012, 8013, 8022, 9090, 9091, 8008}
KNATIVE_PORT_NAMES = {"", "http1", "h2c"}
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# The CRDs are 2 MB of YAML: libyaml's safe loader reads them in a fraction of the time.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

pytestmark = pytest.mark.skipif(
    not CRDS.is_dir(), reason=f"{CRDS} (KServe's CRD schemas) is absent beside the repository"
)


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an openAPIV3Schema where an object with named properties takes no others,
    unless it says it keeps unknown fields (Kubernetes' strict field validation)."""
    schema = copy.deepcopy(schema)

    def close(node: dict[str, Any]) -> None:
        for child in node.get("properties", {}).values():
            close(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                close(node[key])
        for key in ("anyOf", "allOf", "oneOf"):
            for child in node.get(key, []):
                close(child)
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False

    close(schema)
    return schema


def load_crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict schema of that served version, for every CRD file."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=LOADER)  # noqa: S506 (a safe loader)
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = strict(version["schema"]["openAPIV3Schema"])
                schemas[f"{group}/{version['name']}", kind] = schema
    return schemas


@pytest.fixture(scope="module")
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = load_crd_schemas()
    assert {kind for _, kind in schemas} >= {"InferenceService", *RUNTIME_KINDS}, sorted(schemas)
    return schemas


def errors(document: dict[str, Any], schemas: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    key = (document.get("apiVersion", ""), document.get("kind", ""))
    if key not in schemas:
        return [f"no KServe CRD serves {key[0]} {key[1]}"]
    validator = jsonschema.Draft4Validator(schemas[key])
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def shipped() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in documents(path)]


@pytest.mark.parametrize("path", MANIFESTS, ids=[path.name for path in MANIFESTS])
def test_every_kserve_manifest_matches_kserves_crd(
    path: Path, crd_schemas: dict[tuple[str, str], dict[str, Any]]
) -> None:
    for document in documents(path):
        assert errors(document, crd_schemas) == [], document["kind"]


def test_strict_validation_rejects_a_misspelt_field_and_a_wrong_type(
    crd_schemas: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """Guards the test above: a typo in a probe's name or a port given as a word must fail,
    and KServe's own stock runtime must pass."""
    (runtime,) = [doc for doc in shipped() if doc["kind"] in RUNTIME_KINDS]
    (served,) = [
        index
        for index, container in enumerate(runtime["spec"]["containers"])
        if container.get("ports")
    ]
    misspelt = copy.deepcopy(runtime)
    container = misspelt["spec"]["containers"][served]
    container["readinesProbe"] = container.pop("readinessProbe")
    assert any("readinesProbe" in error for error in errors(misspelt, crd_schemas))
    wrong_type = copy.deepcopy(runtime)
    wrong_type["spec"]["containers"][served]["ports"][0]["containerPort"] = "http"
    assert errors(wrong_type, crd_schemas)
    (stock,) = documents(CRDS / "kserve-torchserve-runtime.yaml")
    assert errors(stock, crd_schemas) == []


def test_every_inference_service_names_a_runtime_shipped_here() -> None:
    """No InferenceService relies on modelFormat auto-selection: each model names its runtime,
    that runtime is in deploy/kserve/, lists the model's format (never auto-selected) and
    speaks its protocol."""
    documents_ = shipped()
    runtimes = {doc["metadata"]["name"]: doc for doc in documents_ if doc["kind"] in RUNTIME_KINDS}
    services = [doc for doc in documents_ if doc["kind"] == "InferenceService"]
    assert services and runtimes
    for service in services:
        for component in COMPONENTS:
            model = service["spec"].get(component, {}).get("model")
            if model is None:
                continue
            where = f"{service['metadata']['name']}.{component}"
            assert model.get("runtime") in runtimes, f"{where}: names no runtime shipped here"
            runtime = runtimes[model["runtime"]]["spec"]
            formats = [
                entry
                for entry in runtime["supportedModelFormats"]
                if entry["name"] == model["modelFormat"]["name"]
                and entry.get("version") == model["modelFormat"].get("version")
            ]
            assert formats, f"{where}: the runtime does not list {model['modelFormat']}"
            assert model.get("protocolVersion", "v1") in runtime["protocolVersions"], where
    for name, runtime in runtimes.items():
        spec = runtime["spec"]
        assert not any(entry.get("autoSelect") for entry in spec["supportedModelFormats"]), name
        assert set(spec["protocolVersions"]) <= PROTOCOLS, name


def test_each_runtime_keeps_knatives_rules_for_a_pod_of_several_containers() -> None:
    """Knative serves a pod of several containers only so: one container declares a port (the
    one it routes to), one port, not the queue-proxy's; without its multi-container-probing
    feature (off by default) only that container has probes, and they ask its port. KServe
    merges the InferenceService into kserve-container and, with another container in front,
    Standard mode's Service targets the port of the one named transformer-container."""
    for runtime in [doc for doc in shipped() if doc["kind"] in RUNTIME_KINDS]:
        name = runtime["metadata"]["name"]
        containers = runtime["spec"]["containers"]
        names = [container["name"] for container in containers]
        assert MODEL_SERVER in names, name
        (served,) = [container for container in containers if container.get("ports")]
        assert len(containers) == 1 or served["name"] == IN_FRONT, name
        (serving_port,) = served["ports"]
        assert serving_port["containerPort"] not in KNATIVE_RESERVED_PORTS, name
        assert serving_port.get("name", "") in KNATIVE_PORT_NAMES, name
        for container in containers:
            probes = [probe for probe in PROBES if probe in container]
            if container is not served:
                assert probes == [], f"{name}.{container['name']}: probes Knative refuses"
            for probe in probes:
                action = container[probe].get("httpGet") or container[probe].get("tcpSocket")
                if action is not None:
                    assert action["port"] == serving_port["containerPort"], (name, probe)
