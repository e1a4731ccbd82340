"""Write bert-serve.json, the Grafana dashboard, with Grafana's own SDK (grafana-foundation-sdk).

`python deploy/grafana/dashboard.py` rewrites it; tests/unit/test_dashboard.py fails when the
committed file differs from what this writes, and tests/integration/test_operating.py runs every
query below against a real Prometheus scraping a real server.

Variables: the Prometheus data source, the pods (`instance`), the models (`ModelName`) and their
versions (`ModelVersion`). The server row shows what TorchServe reports per pod: answers by
status (TorchServe counts them per server, not per model), requests and queue wait per model,
worker restarts, memory and GPU (exported only where a GPU is). One row per selected model
then shows the handler's own metrics for its versions: time per batch (p50, p99), the batch
sizes formed, texts classified and texts refused by reason (`deadline_exceeded`: expired).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

OUT = Path(__file__).resolve().parent / "bert-serve.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
PODS = 'instance=~"$instance"'
MODELS = 'model_name=~"$model"'
VERSIONS = 'ModelName=~"$model", ModelVersion=~"$version"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


SERVER = (
    Chart(
        "Answers/s by status",
        "reqps",
        tuple(
            Query(
                f"sum by (instance) (rate(Requests{status}XX{{{PODS}}}[{RATE}]))",
                f"{{{{instance}}}} {status}xx",
            )
            for status in (2, 4, 5)
        ),
        "Every answer of the frontend, by status class (TorchServe counts these per server).",
    ),
    Chart(
        "Requests/s by model",
        "reqps",
        (
            Query(
                f"sum by (instance, model_name) (rate(ts_inference_requests_total{{{PODS}, {MODELS}}}[{RATE}]))",
                "{{instance}} {{model_name}}",
            ),
        ),
        "Requests the model's workers answered.",
    ),
    Chart(
        "Mean queue wait by model",
        "s",
        (
            Query(
                f"sum by (instance, model_name) (rate(ts_queue_latency_microseconds{{{PODS}, {MODELS}}}[{RATE}])) / 1e6"
                f" / sum by (instance, model_name) (rate(ts_inference_requests_total{{{PODS}, {MODELS}}}[{RATE}]))",
                "{{instance}} {{model_name}}",
            ),
        ),
        "Time a request waited for a worker; the queue is sized for 60 s (alert at 48 s).",
    ),
    Chart(
        "Worker restarts",
        "short",
        (
            Query(
                f"changes(WorkerLoadTime{{{PODS}}}[10m])",
                "{{instance}} {{WorkerName}}",
            ),
        ),
        "Times each worker loaded its model again in the last 10 minutes (it died and was replaced).",
    ),
    Chart(
        "Memory used",
        "decmbytes",
        (Query(f"MemoryUsed{{{PODS}}}", "{{instance}}"),),
        "The machine's memory in use, as TorchServe's system metrics report it (MB).",
    ),
    Chart(
        "GPU",
        "percent",
        (
            Query(f"GPUUtilization{{{PODS}}}", "{{instance}} GPU {{DeviceId}} busy"),
            Query(f"GPUMemoryUtilization{{{PODS}}}", "{{instance}} GPU {{DeviceId}} memory"),
        ),
        "Exported only where TorchServe sees a GPU; empty on CPU nodes.",
    ),
)

PER_MODEL = (
    Chart(
        "Time per batch (handler), p50 and p99",
        "s",
        tuple(
            Query(
                f"histogram_quantile({q}, sum by (le, ModelVersion) (rate(HandlerSeconds_bucket{{{PODS}, {VERSIONS}}}[{RATE}])))",
                f"{{{{ModelVersion}}}} p{round(q * 100)}",
            )
            for q in (0.5, 0.99)
        ),
        "From the handler's receipt of a batch to its answers; buckets 5 ms to 10 s.",
    ),
    Chart(
        "Batch sizes formed",
        "short",
        (
            Query(
                f"sum by (ModelVersion) (rate(BatchItems{{{PODS}, {VERSIONS}}}[{RATE}]))"
                f" / sum by (ModelVersion) (rate(Batches{{{PODS}, {VERSIONS}}}[{RATE}]))",
                "{{ModelVersion}} mean",
            ),
            Query(
                f"100 * histogram_quantile(0.99, sum by (le, ModelVersion) (rate(BatchSizeHundreds_bucket{{{PODS}, {VERSIONS}}}[{RATE}])))",
                "{{ModelVersion}} p99",
            ),
        ),
        "Requests per batch the frontend handed the handler.",
    ),
    Chart(
        "Texts/s classified",
        "short",
        (
            Query(
                f"sum by (ModelVersion) (rate(ItemsAccepted{{{PODS}, {VERSIONS}}}[{RATE}]))",
                "{{ModelVersion}}",
            ),
        ),
    ),
    Chart(
        "Texts/s refused, by reason",
        "short",
        (
            Query(
                f"sum by (ModelVersion, Reason) (rate(ItemsRejected{{{PODS}, {VERSIONS}}}[{RATE}]))",
                "{{ModelVersion}} {{Reason}}",
            ),
        ),
        "Refused by the handler; deadline_exceeded: expired before its batch began.",
    ),
)

CHARTS = (*SERVER, *PER_MODEL)


def panel(chart: Chart, width: int) -> timeseries.Panel:
    built = (
        timeseries.Panel()
        .title(chart.title)
        .unit(chart.unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(width)
    )
    if chart.description:
        built = built.description(chart.description)
    for index, query in enumerate(chart.queries):
        built = built.with_target(
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(chr(ord("A") + index))
        )
    return built


def variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def build() -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard("bert-serve")
        .uid("bert-serve")
        .tags(["bert-serve", "torchserve"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(variable("instance", "Pod", "label_values(Requests2XX, instance)"))
        .with_variable(variable("model", "Model", "label_values(Batches, ModelName)"))
        .with_variable(
            variable(
                "version", "Version", 'label_values(Batches{ModelName=~"$model"}, ModelVersion)'
            )
        )
        .with_row(dashboard.Row("Server"))
    )
    for chart in SERVER:
        board = board.with_panel(panel(chart, 8))
    board = board.with_row(dashboard.Row("Model $model").repeat("model"))
    for chart in PER_MODEL:
        board = board.with_panel(panel(chart, 12))
    return board


def render() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(render())


if __name__ == "__main__":
    main()
