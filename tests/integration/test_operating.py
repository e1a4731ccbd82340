"""The dashboard and the alerting rules against a real Prometheus scraping a real TorchServe.

The session's pod server (two models: ``bert`` and ``tiny`` version 2, token auth off, a queue of
8) gets traffic that also takes the error paths: bad items (400), requests past their deadline
(504 deadline_exceeded), a burst that fills the queue (503) and a killed worker (TorchServe
exports a counter only once it has moved). Debian's ``prometheus`` scrapes its metrics port every
second, with deploy/prometheus/rules.yaml loaded. Then every query of
deploy/grafana/bert-serve.json must return data carrying the labels its legend names, for each
model where the panel is per model, and every selector of every alert rule must return data
carrying the labels the rule groups by: a metric the server does not export fails. With
``OPERATING_DATA=path`` the dashboard's series are written there
(docs/operating/dashboard-data.json).

What the model says (docs/operating/README.md, drift): the run begins with traffic drawn from
the default model's held-out reviews (its packed reference) and ends with negative reviews
only; the drift group is loaded with its windows scaled from minutes to seconds. The first keeps
every drift alert silent, the last fires the label-mix alert within its scaled window and hold;
the per-label counters equal the labels of the answers received.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from bert_serve_server.control import Server

from lab.load import ClosedLoop, Job, Outcome, json_job, statuses
from tests.conftest import MAR_PATH
from tests.prometheus_run import api, require_prometheus, running_prometheus
from tests.promql import (
    RULES,
    alert_rules,
    all_rules,
    dashboard_queries,
    selector_groupings,
    with_variables,
)

# alone (scripts/test.sh): bursts meant to be refused, late requests meant to expire
pytestmark = pytest.mark.alone

MODELS = ("bert", "tiny")
RATE_WINDOW = "15s"
"""$__rate_interval: 15 scrapes at the 1 s interval of this run."""
GPU_METRICS = ("GPUUtilization", "GPUMemoryUtilization", "GPUMemoryUsed")
TEXTS = ["A fine, moving film.", "Dull and far too long.", "I would watch it again."]
MAX_SENT = 3000
"""Requests per client group and phase, at most (the phases are bounded in time too)."""


DRIFT_GROUP = "bert-serve-drift"
DRIFT_ALERTS = ("BertServeLabelMixDrift", "BertServeConfidenceFall", "BertServeTruncationJump")
WINDOW_S, HOLD_S = 10, 5
"""The drift group's 10 m windows and 5 m hold, scaled to seconds for this run."""
TEXTS_PER_REQUEST = 2
MATCHED_REQUESTS, MATCHED_S = 300, 16.0
SKEWED_LIMIT_S = 40.0


@dataclass
class Observed:
    prometheus: str
    server: Server
    start: float
    end: float
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)
    killed_worker: str = ""
    matched: tuple[float, float] = (0.0, 0.0)
    answered_labels: Counter[str] = field(default_factory=Counter)
    exported_labels: Counter[str] = field(default_factory=Counter)
    answered_texts: int = 0
    uncertainty_count: float = 0.0
    fired_after_s: float | None = None


def scaled_rules(text: str) -> str:
    """rules.yaml with the drift group's windows and holds in seconds where it says minutes."""
    document = yaml.safe_load(text)
    for group in document["groups"]:
        if group["name"] != DRIFT_GROUP:
            continue
        for rule in group["rules"]:
            rule["expr"] = re.sub(r"\[(\d+)m\]", r"[\1s]", rule["expr"])
            if "for" in rule:
                rule["for"] = re.sub(r"^(\d+)m$", r"\1s", rule["for"])
    return yaml.safe_dump(document, sort_keys=False)


def reference_reviews() -> tuple[list[str], list[str]]:
    """The default model's reference texts (its held-out reviews), and the negative ones."""
    from training import Recipe, examples

    held_out = examples(Recipe())[1]
    return [text for text, _ in held_out], [text for text, label in held_out if label == 0]


def list_jobs(texts: list[str], seed: int) -> Callable[[int], Job]:
    """Requests of ``TEXTS_PER_REQUEST`` texts drawn from ``texts``."""
    draw = random.Random(seed)

    def job(_: int) -> Job:
        chosen = [draw.choice(texts) for _ in range(TEXTS_PER_REQUEST)]
        return Job(json.dumps({"texts": chosen}).encode(), "application/json")

    return job


def labels_answered(outcomes: list[Outcome]) -> tuple[Counter[str], int]:
    """The labels of every text answered 200, and how many texts that is."""
    labels: Counter[str] = Counter()
    for outcome in outcomes:
        if outcome.status == "200":
            for item in json.loads(outcome.body)["results"]:
                if "label" in item:
                    labels[item["label"]] += 1
    return labels, sum(labels.values())


MODEL_SAMPLE = re.compile(r'^(\w+)\{([^}]*ModelName="bert"[^}]*)\}\s+(\S+)$', re.MULTILINE)


def exported(server: Server) -> tuple[Counter[str], float]:
    """bert's per-label answer counters and its Uncertainty histogram's count, from /metrics."""
    text = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
    labels: Counter[str] = Counter()
    count = 0.0
    for name, dims, value in MODEL_SAMPLE.findall(text):
        if name == "AnswersByLabel":
            labels[re.search(r'Label="([^"]*)"', dims).group(1)] += int(float(value))  # type: ignore[union-attr]
        elif name == "Uncertainty_count":
            count += float(value)
    return labels, count


def matched_phase(server: Server, observed: Observed, reviews: list[str]) -> None:
    """Reference-like traffic: 300 requests, then more until ``MATCHED_S``; the counters'
    change over it against the answers' labels."""
    before, count_before = exported(server)
    started = time.time()
    url = server.predict_url_for("bert")
    outcomes = ClosedLoop(url, {}, list_jobs(reviews, 1), 3, 120, MATCHED_REQUESTS).run().outcomes
    left = MATCHED_S - (time.time() - started)
    if left > 0:
        outcomes += ClosedLoop(url, {}, list_jobs(reviews, 2), 3, left, MAX_SENT).run().outcomes
    observed.matched = (started, time.time())
    observed.traffic["matched"] = statuses(outcomes)
    observed.answered_labels, observed.answered_texts = labels_answered(outcomes)
    deadline = time.monotonic() + 10
    while True:  # the frontend takes the worker's last metric lines shortly after the answers
        after, count_after = exported(server)
        observed.exported_labels = after - before
        observed.uncertainty_count = count_after - count_before
        if observed.exported_labels == observed.answered_labels or time.monotonic() > deadline:
            break
        time.sleep(0.5)


def label_mix_fired(prometheus: str) -> bool:
    alerts = api(prometheus, "alerts")["alerts"]
    return any(
        a["labels"].get("alertname") == "BertServeLabelMixDrift"
        and a["labels"].get("ModelName") == "bert"
        and a["state"] == "firing"
        for a in alerts
    )


def skewed_phase(server: Server, observed: Observed, negatives: list[str]) -> None:
    """Negative reviews only, until the label-mix alert fires (bounded in time)."""
    loop = ClosedLoop(
        server.predict_url_for("bert"), {}, list_jobs(negatives, 3), 3, SKEWED_LIMIT_S, MAX_SENT
    )
    started = time.monotonic()

    async def watch() -> None:
        while not loop.stopped and time.monotonic() - started < SKEWED_LIMIT_S:
            if await asyncio.to_thread(label_mix_fired, observed.prometheus):
                observed.fired_after_s = time.monotonic() - started
                loop.stopped = True
            await asyncio.sleep(0.5)

    loop.run(watch())
    observed.traffic["skewed"] = statuses(loop.outcomes)


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
    reviews, negatives = reference_reviews()
    matched_phase(server, observed, reviews)
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
    skewed_phase(server, observed, negatives)


@pytest.fixture(scope="module")
def observed(pod_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    require_prometheus()
    target = pod_server.metrics_url.removeprefix("http://")
    state = tmp_path_factory.mktemp("prometheus")
    rules = state / "rules.yaml"
    rules.write_text(scaled_rules(RULES.read_text()))
    with running_prometheus([target], state, rules) as prometheus:
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


def series(
    observed: Observed, expr: str, start: float | None = None, end: float | None = None
) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = api(
        observed.prometheus,
        "query_range",
        query=expr,
        start=observed.start if start is None else start,
        end=observed.end if end is None else end,
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


WITH_REFERENCE = ("bert",)
"""The models whose archive carries a reference profile (tiny's has none)."""


def needs_reference(expr: str) -> bool:
    return "Reference" in expr or "label_psi" in expr


def test_every_dashboard_query_returns_data_with_its_legend_labels(observed: Observed) -> None:
    """Per model; a query of the reference profile has no data for a model without one."""
    everything = {"instance": ".*", "model": ".*", "version": ".*", "__rate_interval": RATE_WINDOW}
    for query in dashboard_queries():
        per_model = "$model" in query.expr and "ModelName" in query.expr
        for model in MODELS if per_model else (None,):
            values = everything | ({"model": model} if model else {})
            expr = with_variables(query.expr, values)
            if model and model not in WITH_REFERENCE and needs_reference(expr):
                assert not series(observed, expr), f"{model} has no reference: {expr}"
                continue
            found = check_query(observed, expr, query.legend_labels)
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
    assert set(loaded) == {str(rule.get("alert") or rule["record"]) for rule in all_rules()}
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


def test_the_exported_label_counters_equal_the_labels_answered(observed: Observed) -> None:
    """Over the reference-like phase (300 requests and more): each label's counter moved by
    exactly the texts answered with it, and the uncertainty histogram counted each text."""
    assert observed.traffic["matched"].get("200", 0) >= MATCHED_REQUESTS, observed.traffic
    assert set(observed.traffic["matched"]) == {"200"}, observed.traffic["matched"]
    assert observed.answered_labels and len(observed.answered_labels) == 2
    assert observed.exported_labels == observed.answered_labels
    assert observed.uncertainty_count == observed.answered_texts


def test_the_archive_s_reference_profile_is_exported(observed: Observed) -> None:
    """bert.mar carries the profile of its held-out reviews; its workers export it."""
    with zipfile.ZipFile(MAR_PATH) as archive:
        profile = json.loads(archive.read("reference-profile.json"))
    assert profile["texts"] == len(reference_reviews()[0])
    shares = api(observed.prometheus, "query", query='ReferenceLabelShare{ModelName="bert"}')
    exported_shares = {s["metric"]["Label"]: float(s["value"][1]) for s in shares["result"]}
    assert exported_shares == pytest.approx(profile["label_shares"])
    tiny = api(observed.prometheus, "query", query='ReferenceTexts{ModelName="tiny"}')
    assert tiny["result"] == []


def drift_alerts_between(observed: Observed, start: float, end: float) -> list[dict[str, Any]]:
    names = "|".join(DRIFT_ALERTS)
    return series(observed, f'ALERTS{{alertname=~"{names}"}}', start, end)


def test_reference_like_traffic_keeps_every_drift_alert_silent(observed: Observed) -> None:
    """While the held-out reviews came in, the index was computed, with the gate of texts
    passed, and stayed under its mark: no drift alert pending or firing."""
    start, end = observed.matched
    filled = start + WINDOW_S
    assert max_value(observed, 'bert_serve:texts:increase10m{ModelName="bert"}', filled, end) >= 200
    assert max_value(observed, 'bert_serve:label_psi:rate10m{ModelName="bert"}', filled, end) < 0.25
    assert drift_alerts_between(observed, start, end) == []


def test_one_label_only_fires_the_label_mix_alert_within_its_window(observed: Observed) -> None:
    """Negative reviews only: the label-mix alert fires within its window and hold (scaled),
    with a few seconds for the scrape and the evaluation."""
    assert observed.fired_after_s is not None, observed.traffic.get("skewed")
    assert observed.fired_after_s <= WINDOW_S + HOLD_S + 5, observed.fired_after_s


def test_a_model_without_a_reference_gets_no_index(observed: Observed) -> None:
    found = series(observed, 'bert_serve:label_psi:rate10m{ModelName="tiny"}')
    assert found == []
    assert series(observed, 'bert_serve:answer_share:rate10m{ModelName="tiny"}')


def max_value(observed: Observed, expr: str, start: float, end: float) -> float:
    found = series(observed, expr, start, end)
    assert found, f"no data: {expr}"
    return max(float(value) for each in found for _, value in each["values"])
