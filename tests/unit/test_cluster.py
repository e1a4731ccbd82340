"""What a cluster expects beside the pod (deploy/k8s, deploy/prometheus): a disruption budget and
a spread across nodes, a PodMonitor and the PrometheusRule valid against the Prometheus
Operator's own CRD schemas (../shared/prometheus-operator/, as deploy/kserve/ against
../shared/kserve/), the HPA's Pods metric only where an adapter is named, a read-only root with
sized emptyDirs and ephemeral-storage, the key in memory, and a stop that fits the grace period."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.test_deploy import KUBERNETES_VERSION, by_kind, documents, pod_container
from tests.unit.test_kserve import strict

DEPLOY = ROOT / "deploy"
OPERATOR_CRDS = ROOT.parent / "shared" / "prometheus-operator"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def pod_spec() -> dict[str, Any]:
    return dict(by_kind("Deployment")["spec"]["template"]["spec"])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {entry["name"]: entry.get("value", "") for entry in container.get("env", [])}


def test_a_disruption_budget_keeps_one_pod_and_the_pods_spread_over_nodes() -> None:
    labels = by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    budget = by_kind("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] == 1
    assert (
        by_kind("HorizontalPodAutoscaler")["spec"]["minReplicas"] > budget["spec"]["minAvailable"]
    )
    spread = {entry["topologyKey"]: entry for entry in pod_spec()["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["maxSkew"] == 1
    assert (
        spread["kubernetes.io/hostname"]["labelSelector"]["matchLabels"].items() <= labels.items()
    )
    kubernetes_validate.validate(budget, KUBERNETES_VERSION, strict=True)


def python_patterns(node: Any) -> None:
    """Go's regular expressions as Python's re reads them: an inline flag such as ``^(?i)``
    moved to the front; a pattern Python cannot read at all is left out (and so unchecked)."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            for candidate in (pattern, pattern.replace("^(?i)", "(?i)^")):
                try:
                    re.compile(candidate)
                except re.error:
                    continue
                node["pattern"] = candidate
                break
            else:
                del node["pattern"]
        for child in node.values():
            python_patterns(child)
    elif isinstance(node, list):
        for child in node:
            python_patterns(child)


def operator_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for path in sorted(OPERATOR_CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=LOADER)  # noqa: S506 (a safe loader)
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = strict(version["schema"]["openAPIV3Schema"])
                python_patterns(schema)
                schemas[f"{crd['spec']['group']}/{version['name']}", kind] = schema
    return schemas


OPERATOR_MANIFESTS = [
    DEPLOY / "prometheus" / "podmonitor.yaml",
    DEPLOY / "prometheus" / "prometheusrule.yaml",
]


@pytest.mark.skipif(not OPERATOR_CRDS.is_dir(), reason=f"{OPERATOR_CRDS} is absent")
@pytest.mark.parametrize("path", OPERATOR_MANIFESTS, ids=[p.name for p in OPERATOR_MANIFESTS])
def test_the_operators_resources_match_its_crd_schemas(path: Path) -> None:
    schemas = operator_schemas()
    for doc in documents(path):
        schema = schemas[doc["apiVersion"], doc["kind"]]
        jsonschema.validate(doc, schema)
        misspelt = {**doc, "spec": {**doc["spec"], "selectr": {}}}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(misspelt, schema)


def test_the_podmonitor_scrapes_the_metrics_port_of_these_pods() -> None:
    (monitor,) = documents(DEPLOY / "prometheus" / "podmonitor.yaml")
    labels = by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    names = {entry.get("name") for entry in pod_container("torchserve")["ports"]}
    assert endpoint["port"] == "metrics" in names
    policy = by_kind("NetworkPolicy")
    admitted = {rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]}
    assert "metrics" in admitted


def test_the_hpas_pods_metric_is_only_where_its_adapter_is_named() -> None:
    metrics = by_kind("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert [metric["type"] for metric in metrics] == ["Resource"]
    overlay = DEPLOY / "k8s" / "prometheus-adapter"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [".."]
    assert "prometheus-adapter" in (overlay / "kustomization.yaml").read_text()
    (patch,) = kustomization["patches"]
    (hpa,) = documents(overlay / patch["path"])
    types = [metric["type"] for metric in hpa["spec"]["metrics"]]
    assert types == ["Resource", "Pods"], "the patch replaces the list: CPU stays"
    assert hpa["spec"]["metrics"][0] == metrics[0]
    assert "ts_inference_requests_per_second" in (DEPLOY / "README.md").read_text()


def quantity_mib(value: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for unit, factor in units.items():
        if value.endswith(unit):
            return float(value[: -len(unit)]) * factor
    return float(value) / 2**20


def test_read_only_roots_with_sized_emptydirs_and_ephemeral_storage() -> None:
    """Both roots read-only; every emptyDir sized; each container's ephemeral-storage request
    covers the disk-backed emptyDirs it mounts; the rendered key in memory only."""
    volumes = {volume["name"]: volume for volume in pod_spec()["volumes"]}
    for name in ("torchserve", "proxy"):
        container = pod_container(name)
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
        resources = container["resources"]
        assert (
            resources["requests"]["ephemeral-storage"] == resources["limits"]["ephemeral-storage"]
        )
        on_disk = 0.0
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "emptyDir" in volume:
                assert "sizeLimit" in volume["emptyDir"], mount["name"]
                if volume["emptyDir"].get("medium") != "Memory":
                    on_disk += quantity_mib(volume["emptyDir"]["sizeLimit"])
        assert quantity_mib(resources["requests"]["ephemeral-storage"]) >= on_disk, name
    mounts = {m["mountPath"]: m["name"] for m in pod_container("torchserve")["volumeMounts"]}
    assert mounts["/home/model-server"] and mounts["/tmp"]
    proxy_mounts = {m["mountPath"]: m["name"] for m in pod_container("proxy")["volumeMounts"]}
    assert volumes[proxy_mounts["/etc/nginx/conf.d"]]["emptyDir"]["medium"] == "Memory"


def test_the_stop_fits_the_grace_period_with_the_numbers_written() -> None:
    """The proxy's stop delay, then the longest answer (responseTimeout), then the stop budget:
    inside terminationGracePeriodSeconds; the drain's own bound is the first two."""
    from bert_serve_server import ready

    model_config = yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())
    delay = int(env_of(pod_container("proxy"))["BERT_SERVE_PROXY_STOP_DELAY_S"])
    entrypoint = (DEPLOY / "entrypoint.sh").read_text()
    stop_s = int(entrypoint.split('stop_s="${BERT_SERVE_STOP_S:-', 1)[1].split("}", 1)[0])
    grace = pod_spec()["terminationGracePeriodSeconds"]
    assert ready.DRAIN_DEADLINE_S == delay + model_config["responseTimeout"]
    assert ready.DRAIN_DEADLINE_S + stop_s < grace
    assert env_of(pod_container("torchserve"))["BERT_SERVE_DRAIN_WAIT_PORT"] == str(
        pod_container("proxy")["ports"][0]["containerPort"]
    )
    measured = yaml.safe_load((DEPLOY / "image-test.json").read_text())["stop_s"]
    assert stop_s >= 2 * measured, "the stop budget leaves room over the measured stop"
    readme = (DEPLOY / "README.md").read_text()
    for figure in (f"{delay} s", f"{stop_s} s", f"{grace} s"):
        assert figure in readme, figure


def test_the_startup_budget_covers_three_models_at_the_measured_pace() -> None:
    probe = pod_container("torchserve")["startupProbe"]
    measured = yaml.safe_load((DEPLOY / "image-test.json").read_text())["ready_s"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 3 * measured
