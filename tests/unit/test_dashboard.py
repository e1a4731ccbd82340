"""The Grafana dashboard: written by deploy/grafana/dashboard.py with Grafana's SDK (the
committed JSON is what it writes), with model and version variables, a row repeated per model,
and only metrics TorchServe is configured to export (the same holds for the alerting rules).
tests/integration/test_operating.py runs each query against a real Prometheus."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType

import pytest

from tests.promql import (
    DASHBOARD,
    all_rules,
    dashboard_queries,
    declared_metrics,
    metric_names,
    recorded_names,
)


def load_generator() -> ModuleType:
    path = DASHBOARD.parent / "dashboard.py"
    spec = importlib.util.spec_from_file_location("bert_serve_dashboard", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_committed_dashboard_is_what_the_script_writes() -> None:
    assert DASHBOARD.read_text() == load_generator().render(), (
        "run python deploy/grafana/dashboard.py"
    )


def test_variables_and_a_row_per_model() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "instance", "model", "version"} <= set(variables)
    assert "ModelName" in variables["model"]["query"]
    assert "ModelVersion" in variables["version"]["query"]
    assert "$model" in variables["version"]["query"]
    rows = [panel for panel in board["panels"] if panel["type"] == "row"]
    assert [row.get("repeat") for row in rows] == [None, "model"]
    repeated_from = board["panels"].index(rows[1])
    for panel in board["panels"][repeated_from + 1 :]:
        for target in panel["targets"]:
            assert 'ModelName=~"$model"' in target["expr"], panel["title"]
            assert 'ModelVersion=~"$version"' in target["expr"], panel["title"]


def test_every_panel_has_queries_with_legends() -> None:
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(target["legendFormat"] for target in panel["targets"]), panel["title"]
    titles = {query.panel for query in dashboard_queries()}
    for wanted in ("Answers/s by status", "Batch sizes formed", "Worker restarts", "Memory used"):
        assert wanted in titles


@pytest.mark.parametrize(
    "expr",
    [q.expr for q in dashboard_queries()] + [str(rule["expr"]) for rule in all_rules()],
)
def test_queries_name_only_declared_metrics(expr: str) -> None:
    """config/metrics.yaml is what TorchServe exports (it drops undeclared metrics silently);
    the recording rules' series are the others a query may name."""
    names = metric_names(expr)
    known = set(declared_metrics()) | recorded_names()
    assert names, expr
    assert names <= known, sorted(names - known)


def test_an_undeclared_metric_is_caught() -> None:
    """Guards the test above."""
    assert metric_names("rate(ts_worker_deaths_total[5m])") - set(declared_metrics())


def test_the_outside_check_tells_exported_declared_and_missing() -> None:
    """scripts/check_operating_metrics.py, on a made-up metrics page: a sampled metric, a family
    without samples, a histogram's buckets, and one the page lacks (exit 1 in the script)."""
    spec = importlib.util.spec_from_file_location(
        "check_operating_metrics", DASHBOARD.parents[2] / "scripts" / "check_operating_metrics.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (
        '# TYPE Batches counter\nBatches{ModelName="bert",} 3.0\n'
        "# TYPE GPUUtilization gauge\n"
        '# TYPE HandlerSeconds histogram\nHandlerSeconds_bucket{le="0.005",} 1.0\n'
    )
    names = {"Batches", "GPUUtilization", "HandlerSeconds_bucket", "Requests5XX"}
    assert module.states(page, names) == {
        "Batches": "exported",
        "GPUUtilization": "declared only (no sample yet)",
        "HandlerSeconds_bucket": "exported",
        "Requests5XX": "MISSING",
    }
    assert {"Batches", "WorkerLoadTime", "Requests5XX"} <= module.named_metrics()
