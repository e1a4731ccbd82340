"""Check from outside that a running server exports every metric the dashboard and the alerting
rules name: read its Prometheus endpoint once and print each metric as exported (with samples),
declared only (the family is there without samples: a counter that has not moved yet, GPU
metrics on a CPU machine) or missing. Exit 1 when any is missing.

    python scripts/check_operating_metrics.py --metrics-url http://127.0.0.1:8082
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "bert-serve.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
METRIC = re.compile(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\s*(?=[{\[])")
SUFFIX = re.compile(r"_(bucket|sum|count)$")


def named_metrics() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    rules = [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]
    queries += [rule["expr"] for rule in rules]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    # the recording rules' series are Prometheus' own, never on the server's page
    return {name for query in queries for name in METRIC.findall(query)} - recorded


def states(text: str, names: set[str]) -> dict[str, str]:
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    sampled = set(re.findall(r"^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", text, re.MULTILINE))
    found = {}
    for name in sorted(names):
        if name in sampled:
            found[name] = "exported"
        elif SUFFIX.sub("", name) in families or name in families:
            found[name] = "declared only (no sample yet)"
        else:
            found[name] = "MISSING"
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--metrics-url", default="http://127.0.0.1:8082")
    args = parser.parse_args()
    text = requests.get(f"{args.metrics_url.rstrip('/')}/metrics", timeout=30).text
    found = states(text, named_metrics())
    for name, state in found.items():
        print(f"{name:32} {state}")
    return 1 if "MISSING" in found.values() else 0


if __name__ == "__main__":
    sys.exit(main())
