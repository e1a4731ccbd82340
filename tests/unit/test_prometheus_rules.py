"""The alerting rules: promtool checks them and runs their tests (each alert firing on a series
that should fire it, silent beside it), the tests fail when an alert is broken, and the
Operator's PrometheusRule holds exactly the plain file's groups.

promtool comes with Debian's `prometheus` package (scripts/ci_proxy_tools.sh installs it in
CI); without it these tests skip and say so, except under CI=true, where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from bert_serve_server import probe, rules, sizing
from bert_serve_server.config import effective_properties
from bert_serve_server.rules import Machine

from tests.conftest import ROOT
from tests.nginx_run import PROXY_CONF

RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "rules.yaml"
RULE_TESTS = RULES_DIR / "rules.test.yaml"
OPERATOR_RULE = RULES_DIR / "prometheusrule.yaml"
PROMTOOL = shutil.which("promtool")


def promtool() -> str:
    if PROMTOOL is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing in CI: scripts/ci_proxy_tools.sh installs it")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return PROMTOOL


def alerts() -> list[dict[str, object]]:
    return [rule for rule in every_rule() if "alert" in rule]


def every_rule() -> list[dict[str, object]]:
    """Alerting and recording rules, in their groups' order."""
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def alert_place(name: object) -> tuple[int, int]:
    """(group index, rule index) of an alert in rules.yaml."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for g, group in enumerate(groups):
        for r, rule in enumerate(group["rules"]):
            if rule.get("alert") == name:
                return g, r
    raise KeyError(name)


def run_rule_tests(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), "test", "rules", "rules.test.yaml"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_promtool_checks_the_rules() -> None:
    checked = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(every_rule())} rules found" in checked.stdout


def test_promtool_rule_tests_pass() -> None:
    tested = run_rule_tests(RULES_DIR)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    for alert in alerts():
        name = alert["alert"]
        checks = [c for case in cases for c in case["alert_rule_test"] if c["alertname"] == name]
        fired = [label for c in checks for expected in c["exp_alerts"] for label in [expected]]
        assert fired, f"{name}: no test expects it to fire"
        assert all(expected["exp_labels"]["instance"] == "firing" for expected in fired), name
        series = [s["series"] for case in cases for s in case["input_series"]]
        assert any('instance="silent"' in s for s in series)


@pytest.mark.parametrize("broken", ["vector(1)", "vector(1) < 0"], ids=["always", "never"])
@pytest.mark.parametrize("index", range(len(alerts())), ids=[str(a["alert"]) for a in alerts()])
def test_the_rule_tests_fail_when_an_alert_is_broken(
    tmp_path: Path, index: int, broken: str
) -> None:
    """Guards the tests above: an alert that always fires, or never, fails its test."""
    promtool()
    document = yaml.safe_load(RULES.read_text())
    group, place = alert_place(alerts()[index]["alert"])
    document["groups"][group]["rules"][place]["expr"] = broken
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(document))
    shutil.copy(RULE_TESTS, tmp_path / "rules.test.yaml")
    tested = run_rule_tests(tmp_path)
    assert tested.returncode != 0, tested.stdout


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "prometheus_rule", RULES_DIR / "prometheus_rule.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prometheus_rule_holds_the_rules_file() -> None:
    """prometheusrule.yaml is what prometheus_rule.py writes from rules.yaml, same groups."""
    assert OPERATOR_RULE.read_text() == load_generator().render(RULES.read_text()), (
        "run python deploy/prometheus/prometheus_rule.py"
    )
    resource = yaml.safe_load(OPERATOR_RULE.read_text())
    assert (resource["apiVersion"], resource["kind"]) == (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
    )
    assert resource["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def deployment_queue(monkeypatch: pytest.MonkeyPatch) -> int:
    """The queue bound the start derives for deploy/k8s/deployment.yaml's limits, with the
    worker and the rate its image test measured (deploy/image-test.json)."""
    from tests.unit.test_sizing_limits import deployment_limits, fake_start

    record = json.loads((ROOT / "deploy" / "image-test.json").read_text())
    (worker_line,) = [line for line in record["sizing"] if "a worker holds" in line]
    (rates_line,) = [line for line in record["sizing"] if line.startswith("batchSize ")]
    budget = int(worker_line.split("a worker holds ")[1].split()[0]) * 2**20
    rate = max(float(rate) for rate in re.findall(r"([\d.]+) at \d+", rates_line))
    cpus, limit = deployment_limits()
    worker = probe.WorkerMemory(round(budget / sizing.MEASURED_WORKER_HEADROOM), 0, 0)
    pod = Machine(cores=cpus, memory_bytes=limit, gpus=0, cpus=cpus)
    fake_start(monkeypatch, pod, worker, texts_per_s=rate)
    resolved = sizing.resolve(effective_properties(), gpus=0)
    return int(resolved.properties["job_queue_size"])


def test_the_queue_alert_fires_before_the_deployments_queue_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The alert's threshold, in requests waiting, is a quarter to a half of the bound the
    sizing derives for the Deployment's limits (before: a mean wait of 48 s, where that queue
    of 395 drains in about 2 s, so it never fired before the 503s), and its texts say that
    bound."""
    (queue_alert,) = [a for a in alerts() if a["alert"] == "BertServeQueueNearBound"]
    expr = str(queue_alert["expr"])
    assert (
        "rate(ts_queue_latency_microseconds" in expr and "ts_inference_requests_total" not in expr
    )
    threshold = float(re.findall(r">\s*([\d.e]+)\s*$", expr.strip())[0])
    bound = deployment_queue(monkeypatch)
    assert bound / 4 <= threshold <= bound / 2, (threshold, bound)
    assert f"the Deployment's: {bound} requests" in str(queue_alert["annotations"])
    assert f"{bound} requests with deploy/k8s/deployment.yaml" in RULES.read_text()


def test_the_route_timeout_is_the_patient_minute() -> None:
    """The queue is sized to what the workers drain in rules.PATIENT_S at most; that is also
    the proxy's route timeout."""
    conf = PROXY_CONF.read_text()
    route = re.search(
        r"map \$http_x_request_timeout \$request_timeout \{.*?default (\d+);", conf, re.S
    )
    gives_up = re.search(r"proxy_read_timeout (\d+)s;", conf)
    assert route and float(route.group(1)) == rules.PATIENT_S
    assert gives_up and float(gives_up.group(1)) == rules.PATIENT_S


RECORDED = ("bert_serve:label_psi:rate10m", "bert_serve:truncated_share:rate10m")


@pytest.mark.parametrize("name", RECORDED)
def test_the_rule_tests_fail_when_a_tested_recording_rule_is_broken(
    tmp_path: Path, name: str
) -> None:
    """Guards the promql_expr_test cases: a recording rule that records 0 fails its test."""
    promtool()
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == name:
                rule["expr"] = f"({rule['expr']}) * 0"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(document))
    shutil.copy(RULE_TESTS, tmp_path / "rules.test.yaml")
    tested = run_rule_tests(tmp_path)
    assert tested.returncode != 0 and name in tested.stdout + tested.stderr, tested.stdout


def test_drift_thresholds_are_those_docs_operating_states() -> None:
    """The PSI mark, the confidence and truncation steps and the traffic gate, as documented."""
    text = (ROOT / "docs" / "operating" / "README.md").read_text()
    by_name = {str(a["alert"]): str(a["expr"]) for a in alerts()}
    assert "> 0.25" in by_name["BertServeLabelMixDrift"] and "PSI over 0.25" in text
    assert "> 0.1" in by_name["BertServeConfidenceFall"]
    assert "> 0.1" in by_name["BertServeTruncationJump"]
    assert all(">= 200" in by_name[n] for n in DRIFT_ALERTS) and "200 answered texts" in text


DRIFT_ALERTS = ("BertServeLabelMixDrift", "BertServeConfidenceFall", "BertServeTruncationJump")
