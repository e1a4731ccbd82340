"""What the dashboard and the alerting rules ask Prometheus: their queries, the metric names
those name, and the metrics config/metrics.yaml declares (TorchServe exports only those)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "bert-serve.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
METRICS_CONFIG = ROOT / "config" / "metrics.yaml"
METRIC = re.compile(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\s*(?=[{\[])")
RECORDED = re.compile(r"(?<![\w:])(bert_serve:[A-Za-z0-9_:]+)")
"""A recorded series, named as the recording rules name them, with or without matchers."""
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    expr: str
    legend: str

    @property
    def legend_labels(self) -> set[str]:
        return set(LEGEND_LABEL.findall(self.legend))


def metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression selects (each written ``name{...}`` or ``name[...]``,
    or a recorded ``bert_serve:...`` series, written either way or bare)."""
    return set(METRIC.findall(expr)) | set(RECORDED.findall(expr))


def dashboard_queries(path: Path = DASHBOARD) -> list[PanelQuery]:
    board: dict[str, Any] = json.loads(path.read_text())
    return [
        PanelQuery(panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


def alert_rules(path: Path = RULES) -> list[dict[str, Any]]:
    return [rule for rule in all_rules(path) if "alert" in rule]


def all_rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Alerting and recording rules."""
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def recorded_names(path: Path = RULES) -> set[str]:
    """The series the recording rules write (``bert_serve:...``)."""
    return {str(rule["record"]) for rule in all_rules(path) if "record" in rule}


def declared_metrics(path: Path = METRICS_CONFIG) -> dict[str, str]:
    """Metric name -> type, as TorchServe exports them: a histogram as its three series."""
    config = yaml.safe_load(path.read_text())
    declared: dict[str, str] = {}
    for section in ("ts_metrics", "model_metrics"):
        for kind, metrics in config[section].items():
            for metric in metrics:
                declared[metric["name"]] = kind
                if kind == "histogram":
                    for suffix in HISTOGRAM_SUFFIXES:
                        declared[metric["name"] + suffix] = kind
    return declared


def metric_selectors(expr: str) -> set[str]:
    """Every selector of an expression with its matchers: ``ItemsRejected{Reason="..."}``."""
    found: set[str] = set()
    for name in metric_names(expr):
        for match in re.finditer(rf"\b{re.escape(name)}(\{{[^}}]*\}})?", expr):
            found.add(match.group(0))
    return found


def with_variables(expr: str, values: dict[str, str]) -> str:
    """A dashboard query as Grafana sends it: ``$name`` replaced (longest names first)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    return expr


def selector_groupings(expr: str) -> dict[str, set[str]]:
    """Each selector of an expression -> the labels its aggregation keeps: those of the nearest
    ``by (...)`` before it, and ``instance`` (Prometheus' own)."""
    wanted: dict[str, set[str]] = {}
    for selector in metric_selectors(expr):
        for match in re.finditer(re.escape(selector), expr):
            groups = GROUPING.findall(expr[: match.start()])
            labels = {label.strip() for label in groups[-1].split(",")} if groups else set()
            wanted.setdefault(selector, set()).update((labels | {"instance"}) - {"le", ""})
    return wanted
