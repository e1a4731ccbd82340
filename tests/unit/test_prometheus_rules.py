"""The alerting rules: promtool checks them and runs their tests (each alert firing on a series
that should fire it, silent beside it), the tests fail when an alert is broken, and the
Operator's PrometheusRule holds exactly the plain file's groups.

promtool comes with Debian's `prometheus` package (scripts/ci_proxy_tools.sh installs it in
CI); without it these tests skip and say so, except under CI=true, where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from bert_serve_server import sizing

from lab.proxy import PROXY_CONF
from tests.conftest import ROOT

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


def test_thresholds_follow_the_queue_sizing_and_the_route_timeout() -> None:
    """The queue's bound is what the workers drain in sizing.PATIENT_S, so 80% of it is a mean
    wait of 0.8 x PATIENT_S; that is also the proxy's route timeout."""
    (queue,) = [a for a in alerts() if a["alert"] == "BertServeQueueNearBound"]
    threshold = float(re.findall(r">\s*([\d.e]+)\s*$", str(queue["expr"]).strip())[0])
    assert threshold == pytest.approx(0.8 * sizing.PATIENT_S)
    conf = PROXY_CONF.read_text()
    route = re.search(
        r"map \$http_x_request_timeout \$request_timeout \{.*?default (\d+);", conf, re.S
    )
    gives_up = re.search(r"proxy_read_timeout (\d+)s;", conf)
    assert route and float(route.group(1)) == sizing.PATIENT_S
    assert gives_up and float(gives_up.group(1)) == sizing.PATIENT_S


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
