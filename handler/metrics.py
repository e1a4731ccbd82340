"""Per-batch serving metrics, declared in TorchServe's metrics file, updated through its API.

Every name here must be declared under ``model_metrics`` in ``config/metrics.yaml`` with the
same dimensions in the same order, or TorchServe drops it. A server started with another
metrics file (TorchServe's default, a platform's) declares none of them: the emitter asks
the cache once, at worker start, which ones it declares, warns once naming the file and the
missing ones, and from then on emits only those (no lookup, no failure per batch). The counters
are sums, so an operator derives rates and means in Prometheus, e.g. mean formed batch size =
``rate(BatchItems) / rate(Batches)`` and padding efficiency =
``rate(RealTokens) / rate(PaddedTokens)``.

Every metric carries the model's name and version (``ModelName``, ``ModelVersion``), so one
server of several models, or of two versions of one, reports each apart.

    metric            dimensions (all end ModelName, ModelVersion, Level)   per batch, adds
    Batches                                 1
    BatchItems                              requests in the batch (a list request is one)
    SubBatches                              forward passes run
    ItemsAccepted                           texts classified (each text of a list counts)
    ItemsRejected     Reason, ...           requests or texts rejected, by error code;
                                            Reason=deadline_exceeded counts the requests
                                            whose stated deadline passed before their
                                            batch began or would pass before it ends
                                            (none of their texts was forwarded)
    ItemsTruncated                          texts cut at max_length
    RealTokens                              tokens of the texts
    PaddedTokens                            tokens the forward passes computed
    TokenizeMs                              tokenization time
    ForwardMs                               forward time

The histograms draw distributions (p50, p99). TorchServe 0.12 gives every histogram the
Prometheus client's default buckets, 0.005 0.01 0.025 0.05 0.075 0.1 0.25 0.5 0.75 1 2.5 5
7.5 10 (+Inf), and no way to choose others, so each value is scaled to land in them: times in
seconds (5 ms to 10 s), batch size in hundreds of requests (1, 2.5, 5, 7.5, 10, 25, 50, 75, 100
requests), batch tokens in thousands (5 tokens to 10,000). The cost: nothing under 5 ms is
resolved (on a GPU, forwards under 5 ms all fall in the first bucket), and a quantile read from the
buckets is interpolated within one bucket (between 0.25 and 0.5 s, say). One observation per
batch (per forward pass for ForwardSeconds), never one per request: every request of a batch
gets its answer when the batch ends, so HandlerSeconds counts batches, not requests.

    histogram             per batch, observes (dimensions: ModelName, ModelVersion, Level)
    HandlerSeconds        receipt of the batch -> its outcomes, seconds
    ForwardSeconds        each forward pass, seconds
    BatchSizeHundreds     requests in the batch / 100
    BatchTokensThousands  tokens its forward passes computed (padded) / 1000

Each update goes through TorchServe's metrics API: the declared metric from
``context.metrics.get_metric`` and its ``add_or_update(value, dimension_values)``, which writes
the line the frontend reads.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from handler.inference import BatchStats, Prediction
from handler.pipeline import ListOutcome, Outcome
from handler.protocol import ItemOutcome, Rejected

logger = logging.getLogger(__name__)

LEVEL = "Model"
DIMENSIONS = ["ModelName", "ModelVersion", "Level"]
BATCH_COUNTERS = (
    "Batches",
    "BatchItems",
    "SubBatches",
    "ItemsAccepted",
    "ItemsTruncated",
    "RealTokens",
    "PaddedTokens",
    "TokenizeMs",
    "ForwardMs",
)
REJECTED = "ItemsRejected"
COUNTER_DIMENSIONS = {name: DIMENSIONS for name in BATCH_COUNTERS} | {
    REJECTED: ["Reason", *DIMENSIONS]
}
"""Each counter the handler emits, with the dimensions metrics.yaml must declare for it."""
HISTOGRAMS = ("HandlerSeconds", "ForwardSeconds", "BatchSizeHundreds", "BatchTokensThousands")
"""Each histogram the handler emits, all with ``DIMENSIONS``."""


def texts_of(outcomes: Sequence[Outcome]) -> list[ItemOutcome]:
    """One outcome per text: a list request counts each of its texts."""
    items: list[ItemOutcome] = []
    for outcome in outcomes:
        items += outcome.items if isinstance(outcome, ListOutcome) else [outcome]
    return items


def batch_metrics(outcomes: Sequence[Outcome], stats: BatchStats) -> dict[str, float]:
    """The counter increments of one batch (without the per-reason rejections)."""
    texts = texts_of(outcomes)
    return {
        "Batches": 1,
        "BatchItems": len(outcomes),
        "SubBatches": len(stats.sub_batches),
        "ItemsAccepted": sum(isinstance(item, Prediction) for item in texts),
        "ItemsTruncated": sum(isinstance(item, Prediction) and item.truncated for item in texts),
        "RealTokens": stats.real_tokens,
        "PaddedTokens": stats.padded_tokens,
        "TokenizeMs": round(stats.tokenize_ms, 3),
        "ForwardMs": round(stats.forward_ms, 3),
    }


def batch_observations(outcomes: Sequence[Outcome], stats: BatchStats) -> dict[str, list[float]]:
    """The histogram observations of one batch, scaled into the default buckets."""
    return {
        "HandlerSeconds": [round(stats.handler_ms / 1000, 6)],
        "ForwardSeconds": [round(ms / 1000, 6) for ms in stats.sub_batch_forward_ms],
        "BatchSizeHundreds": [len(outcomes) / 100],
        "BatchTokensThousands": [stats.padded_tokens / 1000] if stats.padded_tokens else [],
    }


def rejections_by_reason(outcomes: Sequence[Outcome]) -> dict[str, int]:
    return dict(
        Counter(item.code.value for item in texts_of(outcomes) if isinstance(item, Rejected))
    )


def declared_metrics(cache: Any) -> tuple[dict[str, Any], list[str]]:
    """Our counters and histograms the cache declares with our dimensions, and the names of
    the others."""
    from ts.metrics.metric_type_enum import MetricTypes

    wanted = [(name, MetricTypes.COUNTER, dims) for name, dims in COUNTER_DIMENSIONS.items()]
    wanted += [(name, MetricTypes.HISTOGRAM, DIMENSIONS) for name in HISTOGRAMS]
    declared: dict[str, Any] = {}
    missing: list[str] = []
    for name, metric_type, dimensions in wanted:
        try:
            metric = cache.get_metric(name, metric_type)
        except Exception:
            missing.append(name)
            continue
        if list(getattr(metric, "dimension_names", None) or []) != dimensions:
            missing.append(f"{name} (dimensions must be {dimensions})")
            continue
        declared[name] = metric
    return declared, missing


class MetricsEmitter:
    """Updates one batch's metrics: only those TorchServe's cache declares, checked once
    here; a metrics failure never fails a batch."""

    def __init__(self, cache: Any, model_name: str, model_version: str = "") -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.counters: dict[str, Any] = {}
        self.histograms: dict[str, Any] = {}
        missing = [*COUNTER_DIMENSIONS, *HISTOGRAMS]
        if cache is not None:
            declared, missing = declared_metrics(cache)
            self.counters = {n: m for n, m in declared.items() if n in COUNTER_DIMENSIONS}
            self.histograms = {n: m for n, m in declared.items() if n in HISTOGRAMS}
        if missing:
            source = getattr(cache, "config_file_path", None) or "no metrics cache"
            logger.warning(
                "metrics file %s does not declare %d of the handler's %d metrics, which are "
                "not emitted: %s. Serve with metrics_config=config/metrics.yaml, or declare "
                "them under model_metrics as it does (docs/handler.md, Metrics)",
                source,
                len(missing),
                len(COUNTER_DIMENSIONS) + len(HISTOGRAMS),
                ", ".join(missing),
            )

    def emit(self, outcomes: Sequence[Outcome], stats: BatchStats) -> None:
        try:
            for metric, value, dimension_values in self.updates(outcomes, stats):
                metric.add_or_update(value, dimension_values)
        except Exception:
            logger.warning("could not emit batch metrics; this is a bug", exc_info=True)

    def updates(
        self, outcomes: Sequence[Outcome], stats: BatchStats
    ) -> list[tuple[Any, float, list[str]]]:
        """The batch's updates, (declared metric, value, dimension values): each counter's
        increment, each rejection reason's count, each histogram observation."""
        dimensions = [self.model_name, self.model_version, LEVEL]
        updates: list[tuple[Any, float, list[str]]] = []
        for name, value in batch_metrics(outcomes, stats).items():
            if name in self.counters:
                updates.append((self.counters[name], value, dimensions))
        if REJECTED in self.counters:
            for reason, count in rejections_by_reason(outcomes).items():
                updates.append((self.counters[REJECTED], count, [reason, *dimensions]))
        for name, values in batch_observations(outcomes, stats).items():
            if name in self.histograms:
                updates += [(self.histograms[name], value, dimensions) for value in values]
        return updates
