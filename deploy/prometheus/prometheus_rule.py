"""Write prometheusrule.yaml, the Prometheus Operator's PrometheusRule, from rules.yaml beside it.

The plain rules file is the source (promtool checks and tests it); this wraps its groups,
unchanged, in the resource the Operator reads. `python deploy/prometheus/prometheus_rule.py`
rewrites it; tests/unit/test_prometheus_rules.py fails when the two differ.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yaml"
OUT = HERE / "prometheusrule.yaml"
HEADER = """\
# Generated from rules.yaml by prometheus_rule.py (do not edit; edit rules.yaml and run
# `python deploy/prometheus/prometheus_rule.py`). The Prometheus Operator's PrometheusRule:
# `kubectl apply -f deploy/prometheus/prometheusrule.yaml` in the namespace of bert-serve; the
# label `release` may need to match your Prometheus' ruleSelector.
"""


def prometheus_rule(rules_text: str) -> dict[str, Any]:
    groups = yaml.safe_load(rules_text)["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "bert-serve",
            "labels": {"app.kubernetes.io/name": "bert-serve", "release": "prometheus"},
        },
        "spec": {"groups": groups},
    }


class Literal(str):
    """A string written as a YAML block (the multi-line expressions stay readable)."""


class Dumper(yaml.SafeDumper):  # type: ignore[misc]
    pass


def literal(dumper: yaml.SafeDumper, value: Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


Dumper.add_representer(Literal, literal)


def as_blocks(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: as_blocks(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_blocks(item) for item in value]
    if isinstance(value, str) and "\n" in value:
        return Literal(value)
    return value


def render(rules_text: str) -> str:
    body = yaml.dump(
        as_blocks(prometheus_rule(rules_text)), Dumper=Dumper, sort_keys=False, width=100
    )
    return HEADER + str(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(render(RULES.read_text()))


if __name__ == "__main__":
    main()
