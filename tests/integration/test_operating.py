"""The dashboard and the alerting rules against a real Prometheus scraping a real TorchServe.

The session's pod server (two models: ``bert`` and ``tiny`` version 2, token auth off, a queue of
8) gets traffic that also takes the error paths: bad items (400), requests past their deadline
(504 deadline_exceeded), a burst that fills the queue (503) and a killed worker (TorchServe
exports a counter only once it has moved). Debian's ``prometheus`` scrapes its metrics port every
second, with deploy/prometheus/rules.yaml loaded. Then every query of
deploy/grafana/bert-serve.json must return data carrying the labels its legend names, for each
model where the panel is per model, and every selector of every alert rule must return data
carrying the labels the rule groups by: a metric the server does not export fails. With
``OPERATING_DATA=path`` the dashboard's series are written there for
``scripts/operating_picture.py`` (docs/operating/dashboard.png).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from bert_serve_server.control import Server

from lab.load import ClosedLoop, Job, json_job, statuses
from tests.prometheus_run import api, require_prometheus, running_prometheus
from tests.promql import (
    RULES,
    alert_rules,
    dashboard_queries,
    selector_groupings,
    with_variables,
)

MODELS = ("bert", "tiny")
RATE_WINDOW = "15s"
"""$__rate_interval: 15 scrapes at the 1 s interval of this run."""
GPU_METRICS = ("GPUUtilization", "GPUMemoryUtilization", "GPUMemoryUsed")
TEXTS = ["A fine, moving film.", "Dull and far too long.", "I would watch it again."]
MAX_SENT = 3000
"""Requests per client group and phase, at most (the phases are bounded in time too)."""


@dataclass
class Observed:
    prometheus: str
    server: Server
    start: float
    end: float
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)
    killed_worker: str = ""


def late_headers() -> dict[str, str]:
    """A request stamped 100 s ago with a 1 s wait: past its deadline on arrival."""
    return {"X-Request-Start": f"t={time.time() - 100:.3f}", "X-Request-Timeout": "1"}


def mixed_job(n: int) -> Job:
    if n % 5 == 3:
        return Job(b'{"text": ""}', "application/json", kind="empty", status=400)
    if n % 5 == 4:
        return Job(b'{"nope": 1}', "application/json", kind="missing", status=400)
    return json_job(TEXTS[n % len(TEXTS)])


async def steady(server: Server, seconds: float) -> dict[str, dict[str, int]]:
    """Both models with bad items among the texts, and late requests to bert."""
    loops = {
        "bert": ClosedLoop(server.predict_url_for("bert"), {}, mixed_job, 3, seconds, MAX_SENT),
        "tiny": ClosedLoop(server.predict_url_for("tiny"), {}, mixed_job, 2, seconds, MAX_SENT),
        "bert-late": ClosedLoop(
            server.predict_url_for("bert"), late_headers(), mixed_job, 1, seconds, 30
        ),
    }
    await asyncio.gather(*(loop.run_async() for loop in loops.values()))
    return {name: statuses(loop.outcomes) for name, loop in loops.items()}


def bert_worker(server: Server) -> tuple[int, str]:
    (entry,) = server.describe("bert")
    (worker,) = entry["workers"]
    return int(worker["pid"]), str(worker["id"])


def drive(server: Server, observed: Observed) -> None:
    observed.traffic["steady"] = asyncio.run(steady(server, 10))
    burst = ClosedLoop(
        server.predict_url_for("bert"), {}, lambda n: json_job(TEXTS[n % 3]), 48, 4, 400
    ).run()
    observed.traffic["burst"] = statuses(burst.outcomes)
    pid, worker_id = bert_worker(server)
    before = [worker.pid for worker in server.workers()]
    server.kill_worker(pid)
    server.wait_replaced(pid, before)
    observed.killed_worker = worker_id
    observed.traffic["after-kill"] = asyncio.run(steady(server, 8))


@pytest.fixture(scope="module")
def observed(pod_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    require_prometheus()
    target = pod_server.metrics_url.removeprefix("http://")
    state = tmp_path_factory.mktemp("prometheus")
    with running_prometheus([target], state, RULES) as prometheus:
        observed = Observed(prometheus, pod_server, time.time(), 0.0)
        drive(pod_server, observed)
        time.sleep(3)  # the last answers' counters scraped
        observed.end = time.time()
        yield observed


def test_the_traffic_took_every_error_path(observed: Observed) -> None:
    steady_traffic = observed.traffic["steady"]
    assert steady_traffic["bert"].get("200") and steady_traffic["bert"].get("400")
    assert steady_traffic["tiny"].get("200") and steady_traffic["tiny"].get("400")
    assert steady_traffic["bert-late"].get("504"), steady_traffic
    assert observed.traffic["burst"].get("503"), observed.traffic["burst"]


def series(observed: Observed, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = api(
        observed.prometheus,
        "query_range",
        query=expr,
        start=observed.start,
        end=observed.end,
        step="1s",
    )["result"]
    return result


def exported_without_samples(observed: Observed, expr: str) -> bool:
    """A GPU query on a machine without one: TorchServe declares the family (# TYPE) but
    exports no sample; anything else must have data."""
    names = {name for name in GPU_METRICS if re.search(rf"\b{name}\b", expr)}
    if not names:
        return False
    text = requests.get(f"{observed.server.metrics_url}/metrics", timeout=30).text
    return all(f"# TYPE {name} gauge" in text and f"\n{name}{{" not in text for name in names)


def check_query(observed: Observed, expr: str, wanted: set[str]) -> list[dict[str, Any]]:
    """Its series over the run, each carrying the ``wanted`` labels; AssertionError if none."""
    found = series(observed, expr)
    if not found and exported_without_samples(observed, expr):
        return []
    assert found, f"no data: {expr}"
    for each in found:
        missing = wanted - set(each["metric"])
        assert not missing, f"{expr}: series {each['metric']} lacks {sorted(missing)}"
    return found


PICTURE: dict[str, Any] = {"panels": []}


def test_every_dashboard_query_returns_data_with_its_legend_labels(observed: Observed) -> None:
    everything = {"instance": ".*", "model": ".*", "version": ".*", "__rate_interval": RATE_WINDOW}
    for query in dashboard_queries():
        per_model = "$model" in query.expr and "ModelName" in query.expr
        for model in MODELS if per_model else (None,):
            values = everything | ({"model": model} if model else {})
            found = check_query(observed, with_variables(query.expr, values), query.legend_labels)
            PICTURE["panels"].append(
                {
                    "panel": query.panel,
                    "model": model,
                    "legend": query.legend,
                    "series": [
                        {"metric": each["metric"], "values": each["values"]} for each in found
                    ],
                }
            )
    if os.environ.get("OPERATING_DATA"):
        PICTURE.update(start=observed.start, end=observed.end, traffic=observed.traffic)
        Path(os.environ["OPERATING_DATA"]).write_text(json.dumps(PICTURE, indent=1))


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: str(rule["alert"]))
def test_every_alert_rule_runs_on_exported_metrics_with_its_labels(
    observed: Observed, rule: dict[str, Any]
) -> None:
    """The whole expression evaluates; each selector in it has data over the run, carrying the
    labels the rule groups by (the ones its annotations name)."""
    api(observed.prometheus, "query", query=rule["expr"], time=observed.end)
    for selector, wanted in selector_groupings(str(rule["expr"])).items():
        check_query(observed, f"last_over_time({selector}[1m])", wanted)
    if rule["alert"] == "BertServeWorkerDied":
        assert check_query(observed, "changes(WorkerLoadTime[15m]) > 0", {"WorkerName"})


def test_prometheus_loaded_and_evaluates_every_rule(observed: Observed) -> None:
    groups = api(observed.prometheus, "rules")["groups"]
    loaded = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(loaded) == {str(rule["alert"]) for rule in alert_rules()}
    for name, rule in loaded.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"


def test_the_killed_worker_fires_the_worker_alert(observed: Observed) -> None:
    """A real worker death: its load time changed, so BertServeWorkerDied fires for it."""
    alerts = api(observed.prometheus, "alerts")["alerts"]
    fired = [a for a in alerts if a["labels"]["alertname"] == "BertServeWorkerDied"]
    assert fired and fired[0]["state"] == "firing", alerts
    assert any("bert" in alert["labels"]["WorkerName"] for alert in fired), fired


def test_a_query_naming_an_unexported_metric_fails(observed: Observed) -> None:
    """Guards the checks above: a metric the server does not export has no data."""
    with pytest.raises(AssertionError, match="no data"):
        check_query(observed, f"rate(ts_worker_deaths_total[{RATE_WINDOW}])", set())
