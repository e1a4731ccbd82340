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
    """Every metric a PromQL expression selects (each written ``name{...}`` or ``name[...]``)."""
    return set(METRIC.findall(expr))


def grouping_labels(expr: str) -> set[str]:
    """The labels an expression keeps through ``by (...)``, less ``le`` (consumed by
    histogram_quantile)."""
    return {
        label.strip()
        for group in GROUPING.findall(expr)
        for label in group.split(",")
        if label.strip()
    } - {"le"}


def dashboard_queries(path: Path = DASHBOARD) -> list[PanelQuery]:
    board: dict[str, Any] = json.loads(path.read_text())
    return [
        PanelQuery(panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


def alert_rules(path: Path = RULES) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


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
