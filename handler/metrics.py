"""Per-batch serving metrics, emitted through TorchServe's metrics cache.

Every name here must be declared under ``model_metrics`` in ``config/metrics.yaml`` with the
same dimensions in the same order, or TorchServe drops it. Everything is a counter (a sum),
so an operator derives rates and means in Prometheus, e.g. mean formed batch size =
``rate(BatchItems) / rate(Batches)`` and padding efficiency =
``rate(RealTokens) / rate(PaddedTokens)``. (TorchServe 0.12's histograms use the Prometheus
client's default 0.005..10 buckets, useless for batch sizes and milliseconds.)

    metric            dimensions                 per batch, adds
    Batches           ModelName, Level           1
    BatchItems        ModelName, Level           requests in the batch (a list request is one)
    SubBatches        ModelName, Level           forward passes run
    ItemsAccepted     ModelName, Level           texts classified (each text of a list counts)
    ItemsRejected     Reason, ModelName, Level   requests or texts rejected, by error code;
                                                 Reason=deadline_exceeded counts the requests
                                                 whose deadline passed before their batch began
                                                 (none of their texts was forwarded)
    ItemsTruncated    ModelName, Level           texts cut at max_length
    RealTokens        ModelName, Level           tokens of the texts
    PaddedTokens      ModelName, Level           tokens the forward passes computed
    TokenizeMs        ModelName, Level           tokenization time
    ForwardMs         ModelName, Level           forward time
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


def rejections_by_reason(outcomes: Sequence[Outcome]) -> dict[str, int]:
    return dict(
        Counter(item.code.value for item in texts_of(outcomes) if isinstance(item, Rejected))
    )


class MetricsEmitter:
    """Adds one batch's numbers to TorchServe's cache; a metrics failure never fails a batch."""

    def __init__(self, cache: Any, model_name: str) -> None:
        self.cache = cache
        self.model_name = model_name

    def emit(self, outcomes: Sequence[Outcome], stats: BatchStats) -> None:
        if self.cache is None:
            return
        try:
            from ts.metrics.metric_type_enum import MetricTypes

            for name, value in batch_metrics(outcomes, stats).items():
                metric = self.cache.get_metric(name, MetricTypes.COUNTER)
                metric.add_or_update(value, [self.model_name, LEVEL])
            rejected = self.cache.get_metric("ItemsRejected", MetricTypes.COUNTER)
            for reason, count in rejections_by_reason(outcomes).items():
                rejected.add_or_update(count, [reason, self.model_name, LEVEL])
        except Exception:
            logger.warning(
                "could not emit batch metrics (are they declared in metrics.yaml?)", exc_info=True
            )
