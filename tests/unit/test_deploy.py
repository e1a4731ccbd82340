"""The deployment files: Kubernetes schemas, and agreement with the config they ship.

Nothing here needs a cluster or a Docker engine: the plain manifests are checked against
the Kubernetes OpenAPI schemas that kubernetes-validate ships, and every port, path and
batch setting in deploy/ is compared with the layout python -m bert_serve_server layout generates.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from bert_serve_server import layout as deploy_layout
from bert_serve_server.config import BASE_CONFIG, log_config_path, read_properties

from tests import nginx_run as proxy
from tests.conftest import MAR_PATH, ROOT

KUBERNETES_VERSION = "1.30.0"
DEPLOY = ROOT / "deploy"
KUSTOMIZATION = DEPLOY / "k8s" / "kustomization.yaml"
MANIFESTS = sorted(set((DEPLOY / "k8s").glob("*.yaml")) - {KUSTOMIZATION})


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


def pod_container(name: str) -> dict[str, Any]:
    containers = by_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    (found,) = [container for container in containers if container["name"] == name]
    return dict(found)


@pytest.fixture(scope="module")
def container() -> dict[str, Any]:
    """TorchServe's container (the pod's other one is its proxy)."""
    return pod_container("torchserve")


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


def kserve(kind: str) -> dict[str, Any]:
    found = [
        doc
        for path in sorted((DEPLOY / "kserve").glob("*.yaml"))
        for doc in documents(path)
        if doc["kind"] == kind
    ]
    assert len(found) == 1, f"expected one {kind} in deploy/kserve, found {len(found)}"
    return found[0]


def runtime_container(name: str) -> dict[str, Any]:
    (found,) = [
        container
        for container in kserve("ServingRuntime")["spec"]["containers"]
        if container["name"] == name
    ]
    return dict(found)


def test_kserve_containers_are_valid_containers() -> None:
    """The ServingRuntime's pod (its containers and volumes), and the InferenceService's
    container fields (all but KServe's own), are valid core Pods (tests/unit/test_kserve.py
    checks the rest of both against KServe's CRDs)."""
    runtime = kserve("ServingRuntime")["spec"]
    model = dict(kserve("InferenceService")["spec"]["predictor"]["model"])
    for key in ("modelFormat", "protocolVersion", "storageUri", "runtime"):
        model.pop(key, None)
    for spec in (
        {"containers": runtime["containers"], "volumes": runtime.get("volumes", [])},
        {"containers": [{"name": "kserve-container", **model}]},
    ):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kserve-predictor"},
            "spec": spec,
        }
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


READY_COMMAND = ["python3.11", "-m", "bert_serve_server", "ready"]


def test_probes_ask_every_worker_and_inference_stays_on_the_loopback(
    container: dict[str, Any], layout_config: dict[str, str]
) -> None:
    """Startup runs the ready command's --startup form (every worker READY, not /ping alone),
    readiness the command (a READY worker per version), liveness its --live form; TorchServe serves inference on the pod's loopback, where the
    proxy sends it (the sizing step reads the address from the environment); metrics stay on
    the pod's IP for Prometheus."""
    from bert_serve_server import sizing

    assert named_port(container, "metrics") == port(layout_config["metrics_address"])
    assert {entry["name"] for entry in container["ports"]} == {"metrics"}
    env = {entry["name"]: entry["value"] for entry in container["env"]}
    inference = port(layout_config["inference_address"])
    assert env[sizing.INFERENCE_ADDRESS_ENV] == f"http://127.0.0.1:{inference}"
    assert proxy.POD_UPSTREAM == f"server 127.0.0.1:{inference};"
    assert container["startupProbe"]["exec"]["command"] == [*READY_COMMAND, "--startup"]
    assert container["readinessProbe"]["exec"]["command"] == READY_COMMAND
    assert container["livenessProbe"]["exec"]["command"] == [*READY_COMMAND, "--live"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert pod_container("proxy")[probe]["tcpSocket"]["port"] == "proxy", probe
    assert layout_config["disable_token_authorization"] == "true"
    template = by_kind("Deployment")["spec"]["template"]
    assert "annotations" not in template["metadata"], "the Operator's PodMonitor, not these"


def test_the_pod_is_guaranteed_and_outlives_its_longest_answer() -> None:
    """Every container requests what it is limited to (Guaranteed QoS, as the manifest says),
    and the grace period outlasts the model's responseTimeout."""
    for name in ("torchserve", "proxy"):
        resources = pod_container(name)["resources"]
        assert resources["requests"] == resources["limits"], name
    assert "Guaranteed" in (DEPLOY / "k8s" / "deployment.yaml").read_text()
    model_config = yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())
    grace = by_kind("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > model_config["responseTimeout"]


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
    targets = {entry["name"]: entry["targetPort"] for entry in service["spec"]["ports"]}
    assert targets == {"http": "proxy", "metrics": "metrics"}
    named_port(pod_container("proxy"), "proxy")
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


def test_dockerfile_builds_on_debian_bookworm_with_its_python_and_java() -> None:
    """FROM a base named anywhere (debian:bookworm-slim by default, never :latest), with
    Python 3.11 and Java 17 from Debian; TorchServe and torch come from the wheelhouse,
    pinned by the layout's requirements.txt (test_layout_files)."""
    (from_line,) = dockerfile_instruction("FROM")
    match = re.fullmatch(r"\$\{(\w+)\}", from_line)
    assert match, "the base is a build argument"
    args = dict(arg.split("=", 1) for arg in dockerfile_instruction("ARG") if "=" in arg)
    assert args[match.group(1)] == "debian:bookworm-slim"
    runs = " ".join(dockerfile_instruction("RUN"))
    for package in ("python3.11", "openjdk-17-jre-headless"):
        assert package in runs.split(), package
    assert "--no-index --find-links /wheels" in runs, "pip installs the wheelhouse only"
    assert "HEALTHCHECK" in (DEPLOY / "Dockerfile").read_text()
    assert "/ping" in dockerfile_instruction("HEALTHCHECK")[0]


def test_dockerfile_copies_what_the_layout_contains(
    layout: Path, layout_config: dict[str, str]
) -> None:
    """Each COPY source is in the build context (the layout, plus deploy/entrypoint.sh that
    scripts/image.sh adds), and the entrypoint points at the config and model store that
    layout's config names."""
    for copy_line in dockerfile_instruction("COPY"):
        source, destination = copy_line.split()[-2:]
        if source == "entrypoint.sh":
            assert (DEPLOY / source).is_file()
            continue
        if source == "lib":
            assert (
                "server/bert_serve_server/sizing.py" in (ROOT / "scripts" / "image.sh").read_text()
            )
            continue
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


def test_entrypoint_stops_torchserve_on_sigterm() -> None:
    """PID 1 turns SIGTERM into the server package's bounded stop and runs TorchServe in the
    foreground."""
    script = (DEPLOY / "entrypoint.sh").read_text()
    assert "python3.11 -m bert_serve_server ready --drain" in script
    assert 'python3.11 -m bert_serve_server stop --timeout "$stop_s"\' TERM INT' in script
    assert "torchserve --foreground --ncs" in script
    assert (DEPLOY / "entrypoint.sh").stat().st_mode & 0o111, "executable"


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


def test_kserve_runtime_matches_the_layout_and_deployment(
    container: dict[str, Any], layout_config: dict[str, str]
) -> None:
    """The ServingRuntime runs the Deployment's image the way the Deployment does: the image's
    entrypoint, its user and footprint, and Prometheus pointed at the metrics port; the
    InferenceService asks for the same footprint."""
    isvc, runtime = kserve("InferenceService"), kserve("ServingRuntime")
    assert (isvc["apiVersion"], runtime["apiVersion"]) == (
        "serving.kserve.io/v1beta1",
        "serving.kserve.io/v1alpha1",
    )
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert "REPLACE" in model["storageUri"], "the bucket is a placeholder and must say so"
    served = runtime_container("kserve-container")
    assert served["image"] == container["image"]
    assert served["resources"] == container["resources"] == model["resources"]
    assert [*served["command"], *served["args"]] == json.loads(
        dockerfile_instruction("ENTRYPOINT")[0]
    ), "the runtime runs the image's own entrypoint"
    assert served["securityContext"]["runAsUser"] == int(dockerfile_instruction("USER")[-1])
    annotations = runtime["spec"]["annotations"]
    assert int(annotations["prometheus.kserve.io/port"]) == port(layout_config["metrics_address"])
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/enable-prometheus-scraping"] == "true"


def test_kserve_reaches_torchserve_only_through_the_proxy(
    container: dict[str, Any], layout_config: dict[str, str]
) -> None:
    """The image's TorchServe has token auth off, so KServe's pod runs the Deployment's proxy
    too: the proxy is the one container with a port (Knative routes to it; KServe's Standard
    mode by its name, transformer-container), with the Deployment's image, port, key, config
    and mounts; TorchServe's inference listens on the pod's loopback, as in the Deployment, and
    it declares no port and no probe (Knative refuses a probe on a container without the port,
    unless its multi-container-probing feature is on). The probes are the proxy's, on /ping,
    with the Deployment's timings."""
    assert layout_config["disable_token_authorization"] == "true"
    containers = kserve("ServingRuntime")["spec"]["containers"]
    assert {entry["name"] for entry in containers} == {"kserve-container", "transformer-container"}
    (fronted,) = [entry for entry in containers if entry.get("ports")]
    assert fronted["name"] == "transformer-container"
    served = runtime_container("kserve-container")
    env = {entry["name"]: entry["value"] for entry in served["env"]}
    pod_env = {entry["name"]: entry["value"] for entry in container["env"]}
    assert env == pod_env
    assert env["BERT_SERVE_INFERENCE_ADDRESS"] == (
        f"http://127.0.0.1:{port(layout_config['inference_address'])}"
    )
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(served)
    pod_proxy = pod_container("proxy")
    for key in ("image", "env", "volumeMounts", "resources"):
        assert fronted[key] == pod_proxy[key], key
    proxy_port = named_port(pod_proxy, "proxy")
    assert [entry["containerPort"] for entry in fronted["ports"]] == [proxy_port]
    assert env["BERT_SERVE_DRAIN_WAIT_PORT"] == str(proxy_port)
    for key in ("runAsUser", "runAsGroup", "readOnlyRootFilesystem", "allowPrivilegeEscalation"):
        assert fronted["securityContext"][key] == pod_proxy["securityContext"][key], key
    volumes = {entry["name"]: entry for entry in kserve("ServingRuntime")["spec"]["volumes"]}
    pod_volumes = {
        entry["name"]: entry
        for entry in by_kind("Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    for mount in fronted["volumeMounts"]:
        assert volumes[mount["name"]] == pod_volumes[mount["name"]], mount["name"]
    for probe in ("startupProbe", "readinessProbe"):
        assert fronted[probe]["httpGet"] == {"path": "/ping", "port": proxy_port}, probe
        timing = {key: value for key, value in container[probe].items() if key != "exec"}
        assert {key: value for key, value in fronted[probe].items() if key != "httpGet"} == timing
    assert fronted["livenessProbe"] == pod_proxy["livenessProbe"] | {
        "tcpSocket": {"port": proxy_port}
    }


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity in MiB (the suffixes the manifests use)."""
    units = {"Mi": 1.0, "Gi": 1024.0, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    for suffix, factor in units.items():
        if quantity.endswith(suffix) and quantity[: -len(suffix)].replace(".", "").isdigit():
            return float(quantity[: -len(suffix)]) * factor
    raise ValueError(f"unexpected memory quantity {quantity!r}")


def test_memory_requests_cover_what_the_running_container_used(container: dict[str, Any]) -> None:
    """deploy/image-test.json is `make image-test`'s record of the image run for real: the
    memory each process used (PSS: shared pages split among the processes that map them)
    after a burst. The pod must request at least that, and the limit leaves headroom."""
    measured = json.loads((DEPLOY / "image-test.json").read_text())
    roles = [process["role"] for process in measured["processes"]]
    assert roles.count("frontend") == 1 and roles.count("worker") >= 1, roles
    used_mib = sum(process["pss_mib"] for process in measured["processes"])
    resources = container["resources"]
    assert mebibytes(resources["requests"]["memory"]) >= used_mib
    assert mebibytes(resources["limits"]["memory"]) >= 1.25 * used_mib
    assert (
        measured["stop_s"]
        < by_kind("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )


def test_the_image_record_is_of_the_current_entrypoint_and_sizing_under_the_pods_limits(
    container: dict[str, Any],
) -> None:
    """deploy/image-test.json was measured by `make image-test` on the entrypoint and sizing
    that are here now, with the TorchServe container's own CPU and memory limits, its readiness
    probe not ready while the workers loaded, and no patient client refused. After a change to
    either file: make image image-test IMAGE_TEST_OUT=deploy/image-test.json."""
    from lab import image

    measured = json.loads((DEPLOY / "image-test.json").read_text())
    assert measured["sized_from"] == image.sized_from(), (
        f"deploy/image-test.json is older than {' or '.join(image.SIZED_FILES)}: rerun "
        "make image image-test IMAGE_TEST_OUT=deploy/image-test.json"
    )
    assert measured["limits"] == image.pod_limits()
    assert image.pod_limits()["memory"] == container["resources"]["limits"]["memory"].replace(
        "Mi", "m"
    )
    assert measured["probe_not_ready_polls"] > 0
    manifest = (DEPLOY / "k8s" / "deployment.yaml").read_text()
    used = sum(process["pss_mib"] for process in measured["processes"])
    # the queue in force: the last line that sets it (a heap can cut what the rate gave)
    queue = [
        m.group(1)
        for line in measured["sizing"]
        if (m := re.match(r"queue (?:cut to )?(\d+)", line))
    ][-1]
    workers = [process["role"] for process in measured["processes"]].count("worker")
    for figure in (f"{used:.0f} MiB in all", f"a queue of {queue} requests", f"{workers} worker"):
        assert figure in manifest.replace("\n          # ", " "), (
            f"deployment.yaml lacks {figure!r}"
        )
    assert measured["ready_s"] >= measured["probe_ready_s"] > 0
    assert set(measured["patient"]["statuses"]) == {"200"}


def test_the_pod_record_is_of_the_current_pod_and_nothing_was_lost_at_its_stops() -> None:
    """deploy/pod-test.json was measured by `make pod-test` (the Deployment under podman kube
    play) on the entrypoint, manifest, proxy and readiness that are here now: patient clients
    all answered, a killed frontend's container restarted, the stated pod ran what was stated
    (2 workers, batchSize 4), and both stops (1 worker, 2 stated)
    with every request answered and every container exiting 0 within the grace period. After
    a change to any of them: make pod-test POD_TEST_OUT=deploy/pod-test.json."""
    from lab import pod
    from lab.image import STATED_ENV
    from lab.pod import MEASURED, measured_from

    record = json.loads((DEPLOY / "pod-test.json").read_text())
    assert record["measured_from"] == measured_from(), (
        f"deploy/pod-test.json is older than {' or '.join(MEASURED)}: rerun make pod-test "
        "POD_TEST_OUT=deploy/pod-test.json"
    )
    assert record["limits"] == pod.container_limits()
    assert set(record["patient"]["statuses"]) == {"200"}
    assert record["frontend_killed"]["restarts"] >= 1
    stated = record["two_workers"]["stated"]
    assert (stated["workers"], stated["batchSize"]) == (2, 4) and stated["env"] == STATED_ENV
    for stop in (record["stop"], record["two_workers"]["stop"]):
        assert set(stop["statuses"]) == {"200"} and stop["stop_s"] <= record["grace_s"]
        assert set(stop["exit_codes"].values()) == {"0"}


def test_three_models_start_within_the_startup_probes_budget() -> None:
    """deploy/models-start.json (`make models-start`): an image of three models, started with
    the pod's CPUs on the sizing here now, passed its startup probe within the budget the
    Deployment gives it. After a change to the sizing: make models-start
    MODELS_START_OUT=deploy/models-start.json."""
    from lab import image

    record = json.loads((DEPLOY / "models-start.json").read_text())
    assert record["sized_from"] == image.sized_from(), "rerun make models-start"
    assert record["limits"]["cpus"] == image.pod_limits()["cpus"]
    assert len(record["models"]) == 3
    assert record["startup_budget_s"] == image.startup_budget_s()
    assert 0 < record["ready_s"] < record["startup_budget_s"]


def test_the_proxy_fronts_torchserve_with_the_shipped_config(layout_config: dict[str, str]) -> None:
    """kustomization.yaml makes the proxy's ConfigMap from the file the proxy test runs; the
    proxy listens on its container port and forwards to TorchServe's inference port."""
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert sorted(kustomization["resources"]) == sorted(path.name for path in MANIFESTS)
    (generated,) = kustomization["configMapGenerator"]
    assert [DEPLOY / "k8s" / name for name in generated["files"]] == [proxy.PROXY_CONF]
    volumes = by_kind("Deployment")["spec"]["template"]["spec"]["volumes"]
    (conf_volume,) = [volume for volume in volumes if volume["name"] == "proxy-conf"]
    assert conf_volume["configMap"] == {
        "name": generated["name"],
        "items": [{"key": proxy.PROXY_CONF.name, "path": "default.conf.template"}],
    }
    conf = proxy.PROXY_CONF.read_text()
    assert f"listen {named_port(pod_container('proxy'), 'proxy')};" == proxy.POD_LISTEN
    assert proxy.POD_LISTEN in conf and proxy.POD_UPSTREAM in conf
    assert proxy.POD_UPSTREAM == f"server 127.0.0.1:{port(layout_config['inference_address'])};"


def test_a_layout_of_several_models_holds_each_archive_and_serves_each(tmp_path: Path) -> None:
    """make deploy-layout MODELS=...: every archive in model-store/, the config loading each
    (default version first) with its own models= entry."""
    from bert_serve_server.config import parse_models, serving_overrides

    store = tmp_path / "store"
    store.mkdir()
    specs = parse_models("sentiment=a toxicity:1=b toxicity:2=c")
    models = serving_overrides(specs, {}) | {"model_store": str(store)}
    for name in models["load_models"].split(","):
        (store / name).write_bytes(b"mar")
    out = deploy_layout.write_layout(tmp_path / "layout", models=models)
    assert sorted(p.name for p in (out / "model-store").iterdir()) == [
        "sentiment.mar",
        "toxicity-v1.mar",
        "toxicity-v2.mar",
    ]
    config = read_properties(out / "config" / "config.properties")
    assert config["load_models"] == models["load_models"]
    assert json.loads(config["models"]) == json.loads(models["models"])
    assert config["model_store"] == f"{deploy_layout.MOUNT}/model-store"


def test_the_proxy_takes_its_key_from_the_secret_through_the_template() -> None:
    """The nginx image's entrypoint writes conf.d/*.conf from templates/*.template, replacing
    only the variables NGINX_ENVSUBST_FILTER names: the key's, from the Secret (required, so a
    pod without it does not start); conf.d is writable, the template read-only."""
    container = pod_container("proxy")
    env = {entry["name"]: entry for entry in container["env"]}
    assert env[proxy.KEY_VARIABLE]["valueFrom"]["secretKeyRef"] == {
        "name": "bert-serve-proxy-key",
        "key": "key",
    }
    assert re.fullmatch(env["NGINX_ENVSUBST_FILTER"]["value"], proxy.KEY_VARIABLE)
    assert not re.search(env["NGINX_ENVSUBST_FILTER"]["value"], "HOSTNAME")
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["proxy-conf"]["mountPath"] == "/etc/nginx/templates"
    assert mounts["proxy-conf"]["readOnly"] is True
    assert mounts["proxy-conf-d"]["mountPath"] == "/etc/nginx/conf.d"
    assert not mounts["proxy-conf-d"].get("readOnly")
    conf = proxy.PROXY_CONF.read_text()
    assert f'"~^[Bb][Ee][Aa][Rr][Ee][Rr] +{proxy.KEY_PLACEHOLDER}$" 1;' in conf
    assert f'map "{proxy.KEY_PLACEHOLDER}" $key_usable' in conf
    assert 'proxy_set_header Authorization "";' in conf


def test_the_network_policy_admits_the_proxy_port_and_prometheus_alone() -> None:
    """Ingress to the pods: the proxy's port from anywhere, the metrics port from Prometheus'
    pods only; TorchServe's own port (reached by the proxy inside the pod) from nowhere."""
    policy = by_kind("NetworkPolicy")
    deployment = by_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    named = {
        entry["name"]
        for container in deployment["spec"]["template"]["spec"]["containers"]
        for entry in container["ports"]
    }
    rules = {rule["ports"][0]["port"]: rule for rule in spec["ingress"]}
    assert set(rules) == {"proxy", "metrics"} <= named
    assert all(len(rule["ports"]) == 1 for rule in spec["ingress"])
    assert "from" not in rules["proxy"], "clients reach the proxy from anywhere"
    (source,) = rules["metrics"]["from"]
    assert source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert "namespaceSelector" in source


@pytest.mark.skipif(shutil.which("envsubst") is None, reason="envsubst (gettext-base) is absent")
def test_the_local_runs_put_the_key_in_as_the_images_entrypoint_does() -> None:
    """The nginx image runs `envsubst` with the variables NGINX_ENVSUBST_FILTER admits; the
    proxy test's local substitution gives the very same text (addresses aside)."""
    key = "k3y_" + "0123456789abcdef" * 3
    entrypoint = subprocess.run(
        ["envsubst", proxy.KEY_PLACEHOLDER],
        input=proxy.PROXY_CONF.read_text(),
        env={"PATH": os.environ["PATH"], proxy.KEY_VARIABLE: key, "HOSTNAME": "pod"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    local = proxy.local_server_conf(8000, "127.0.0.1:8080", key)
    assert local == entrypoint.replace(proxy.POD_LISTEN, "listen 127.0.0.1:8000;")
    assert proxy.KEY_PLACEHOLDER not in local and f" +{key}$" in local
