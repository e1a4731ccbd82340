"""Write bert-serve.json, the Grafana dashboard, with Grafana's own SDK (grafana-foundation-sdk).

`python deploy/grafana/dashboard.py` rewrites it; tests/unit/test_dashboard.py fails when the
committed file differs from what this writes, and tests/integration/test_operating.py runs every
query below against a real Prometheus scraping a real server.

Variables: the Prometheus data source, the pods (`instance`), the models (`ModelName`) and their
versions (`ModelVersion`). The server row shows what TorchServe reports per pod: answers by
status (TorchServe counts them per server, not per model), requests and queue wait per model,
worker restarts, memory and GPU (exported only where a GPU is). One row per selected model
then shows the handler's own metrics for its versions: time per batch (p50, p99), the batch
sizes formed, texts classified and texts refused by reason (`deadline_exceeded`: expired),
the windows of each long text and the share of texts windowed, then what the model says against its reference profile (the drift rules' recorded series,
deploy/prometheus/rules.yaml): answers by label, the label mix live and reference with its
population stability index, the mean top score and the truncated share and text length, each
live and reference. A model packaged without a reference shows the live side only.
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
        "Time a request waited for a worker, on average. The queue alert is on the requests"
        " waiting instead (BertServeQueueNearBound: about half the queue's bound).",
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
    Chart(
        "Windows per long text",
        "short",
        (
            *(
                Query(
                    f"100 * histogram_quantile({q}, sum by (le, ModelVersion) (rate(TextWindowsHundreds_bucket{{{PODS}, {VERSIONS}}}[{RATE}])))"
                    f" or 0 * sum by (ModelVersion) (rate(ItemsAccepted{{{PODS}, {VERSIONS}}}[{RATE}]))",
                    f"{{{{ModelVersion}}}} p{round(q * 100)}",
                )
                for q in (0.5, 0.99)
            ),
            Query(
                f"100 * sum by (ModelVersion) (rate(ItemsWindowed{{{PODS}, {VERSIONS}}}[{RATE}]))"
                f" / sum by (ModelVersion) (rate(ItemsAccepted{{{PODS}, {VERSIONS}}}[{RATE}]))",
                "{{ModelVersion}} % of texts windowed",
            ),
        ),
        "Windows of each text over max_length classified whole (long_texts: windows), p50 and"
        " p99 (0: no such text yet), and the share of texts windowed, in percent.",
    ),
)

DRIFT = (
    Chart(
        "Answers/s by label",
        "short",
        (
            Query(
                f"sum by (ModelVersion, Label) (rate(AnswersByLabel{{{PODS}, {VERSIONS}}}[{RATE}]))",
                "{{ModelVersion}} {{Label}}",
            ),
        ),
        "Labels answered (multi-label: each label given; one logit: its label or none).",
    ),
    Chart(
        "Label mix (10 min) and reference",
        "percentunit",
        (
            Query(
                f"avg by (ModelVersion, Label) (bert_serve:answer_share:rate10m{{{PODS}, {VERSIONS}}})",
                "{{ModelVersion}} {{Label}} live",
            ),
            Query(
                f"max by (ModelVersion, Label) (ReferenceLabelShare{{{PODS}, {VERSIONS}}})",
                "{{ModelVersion}} {{Label}} reference",
            ),
        ),
        "Each label's share of the answers over 10 minutes, beside its share on the reference texts.",
    ),
    Chart(
        "Label-mix shift (PSI; alert over 0.25)",
        "short",
        (
            Query(
                f"max by (instance, ModelVersion) (bert_serve:label_psi:rate10m{{{PODS}, {VERSIONS}}})",
                "{{instance}} {{ModelVersion}}",
            ),
        ),
        "Population stability index of the 10-minute label mix against the reference.",
    ),
    Chart(
        "Top score: mean (10 min), p10 and reference",
        "percentunit",
        (
            Query(
                f"1 - avg by (ModelVersion) (bert_serve:uncertainty_mean:rate10m{{{PODS}, {VERSIONS}}})",
                "{{ModelVersion}} mean",
            ),
            Query(
                f"1 - histogram_quantile(0.9, sum by (le, ModelVersion) (rate(Uncertainty_bucket{{{PODS}, {VERSIONS}}}[{RATE}])))",
                "{{ModelVersion}} p10",
            ),
            Query(
                f"1 - max by (ModelVersion) (ReferenceUncertaintyMean{{{PODS}, {VERSIONS}}})",
                "{{ModelVersion}} reference mean",
            ),
        ),
        "The model's confidence in its answers; the alert fires 0.1 under the reference mean.",
    ),
    Chart(
        "Texts truncated (10 min) and reference",
        "percentunit",
        (
            Query(
                f"avg by (ModelVersion) (bert_serve:truncated_share:rate10m{{{PODS}, {VERSIONS}}})",
                "{{ModelVersion}} live",
            ),
            Query(
                f"max by (ModelVersion) (ReferenceTruncatedShare{{{PODS}, {VERSIONS}}})",
                "{{ModelVersion}} reference",
            ),
        ),
        "Texts longer than max_length, answered from their first tokens only.",
    ),
    Chart(
        "Tokens per text and reference",
        "short",
        (
            Query(
                f"sum by (ModelVersion) (rate(RealTokens{{{PODS}, {VERSIONS}}}[{RATE}]))"
                f" / sum by (ModelVersion) (rate(ItemsAccepted{{{PODS}, {VERSIONS}}}[{RATE}]))",
                "{{ModelVersion}} live",
            ),
            Query(
                f"max by (ModelVersion) (ReferenceTokensMean{{{PODS}, {VERSIONS}}})",
                "{{ModelVersion}} reference",
            ),
        ),
        "Mean input length in tokens, special tokens included (a long text's windows together).",
    ),
)

CHARTS = (*SERVER, *PER_MODEL, *DRIFT)


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
    for chart in (*PER_MODEL, *DRIFT):
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
