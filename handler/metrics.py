"""Per-batch serving metrics, through TorchServe's metrics API (what each one counts, and why
histogram values are scaled: docs/handler.md). Each must be declared in config/metrics.yaml
with the same dimensions in the same order, or TorchServe drops it."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from handler.values import BatchStats, ItemOutcome, ListOutcome, Outcome, Prediction, Rejected

logger = logging.getLogger(__name__)

LEVEL = "Model"
DIMENSIONS = ["ModelName", "ModelVersion", "Level"]
BATCH_COUNTERS = (
    "Batches",
    "BatchItems",
    "SubBatches",
    "ItemsAccepted",
    "ItemsTruncated",
    "ItemsWindowed",
    "Windows",
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
HISTOGRAMS = (
    "HandlerSeconds",
    "ForwardSeconds",
    "BatchSizeHundreds",
    "BatchTokensThousands",
    "TextWindowsHundreds",
)
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
        "ItemsWindowed": sum(count > 1 for count in stats.windows),
        "Windows": sum(stats.windows),
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
        "TextWindowsHundreds": [count / 100 for count in stats.windows if count > 1],
    }


def rejections_by_reason(outcomes: Sequence[Outcome]) -> dict[str, int]:
    return dict(
        Counter(item.code.value for item in texts_of(outcomes) if isinstance(item, Rejected))
    )


def declared_metrics(cache: Any) -> tuple[dict[str, Any], list[str]]:
    """Our metrics the cache declares with our dimensions, and the names of the others."""
    from ts.metrics.metric_type_enum import MetricTypes

    wanted = [(name, MetricTypes.COUNTER, dims) for name, dims in COUNTER_DIMENSIONS.items()]
    wanted += [(name, MetricTypes.HISTOGRAM, DIMENSIONS) for name in HISTOGRAMS]
    return declared_of(cache, wanted)


def declared_of(
    cache: Any, wanted: list[tuple[str, Any, list[str]]]
) -> tuple[dict[str, Any], list[str]]:
    """Of ``wanted`` (name, metric type, dimensions), the metrics the cache declares with those
    dimensions, and the names of the others."""
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
    """Updates the declared metrics (checked once, here); a metrics failure never fails a batch."""

    def __init__(self, cache: Any, model_name: str, model_version: str = "") -> None:
        self.dimensions = [model_name, model_version, LEVEL]
        self.declared: dict[str, Any] = {}
        missing = [*COUNTER_DIMENSIONS, *HISTOGRAMS]
        if cache is not None:
            self.declared, missing = declared_metrics(cache)
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
        """The batch's (declared metric, value, dimension values), counters first."""
        declared, dimensions = self.declared, self.dimensions
        updates: list[tuple[Any, float, list[str]]] = []
        for name, value in batch_metrics(outcomes, stats).items():
            if name in declared:
                updates.append((declared[name], value, dimensions))
        if REJECTED in declared:
            for reason, count in rejections_by_reason(outcomes).items():
                updates.append((declared[REJECTED], count, [reason, *dimensions]))
        for name, values in batch_observations(outcomes, stats).items():
            if name in declared:
                updates += [(declared[name], value, dimensions) for value in values]
        return updates
