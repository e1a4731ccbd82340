"""The handler's metrics, through TorchServe's metrics API, in two families; each must be
declared in config/metrics.yaml with the same dimensions in the same order, or TorchServe
drops it.

What each batch cost (``MetricsEmitter``): what each one counts, and why histogram values are
scaled: docs/handler.md.

What the model says (``ModelMetrics``), per model and version, and the reference profile it is
compared with (docs/operating/README.md, Drift). Per batch, from the model's own predictions
(before a request's ``top_k`` or ``raw_scores`` reshape its answer): ``AnswersByLabel`` counts
the labels answered, one increment per label present in the batch; ``Uncertainty`` observes 1 -
the top score of each answered text (the confidence's shortfall, so TorchServe's fixed buckets
0.005..10 resolve the confident end); ``RegressionValue`` observes a regression head's value
instead. Input length and truncation are the serving counters' ``RealTokens``,
``ItemsTruncated`` and ``ItemsAccepted``.

What a text's answer is, by head (``handler.model.head_kind``): single-label, its top label;
multi-label, each label over the threshold, or ``none``; one-logit, its label when the score
is at least 0.5, else ``none``; regression, no label. A model with more than ``MAX_LABELS``
labels keeps that many (the reference's most frequent, else the first by class index) and
counts the rest as ``other``.

The reference profile is the same quantities over texts the user gives, computed when the
archive is packaged (``bert_serve_server.archive``) and kept in the .mar as
``PROFILE_FILE``; a worker exports it as ``Reference*`` gauges at start.

Which predictions were answered is the pipeline's rule, ``handler.pipeline.finite_or_rejected``,
imported from there: the pipeline never imports this module, so the two make no cycle.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.pipeline import finite_or_rejected
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


PROFILE_FILE = "reference-profile.json"
MAX_LABELS = 20
"""Label values per model at most, besides ``other`` and ``none``."""
OTHER = "other"
NONE = "none"
ONE_LOGIT_THRESHOLD = 0.5
REGRESSION = "regression"
LABEL_DIMENSIONS = ["Label", *DIMENSIONS]
MODEL_COUNTERS = {"AnswersByLabel": LABEL_DIMENSIONS}
MODEL_HISTOGRAMS = {"Uncertainty": DIMENSIONS, "RegressionValue": DIMENSIONS}
MODEL_GAUGES = {
    "ReferenceLabelShare": LABEL_DIMENSIONS,
    "ReferenceUncertaintyMean": DIMENSIONS,
    "ReferenceTruncatedShare": DIMENSIONS,
    "ReferenceTokensMean": DIMENSIONS,
    "ReferenceValueMean": DIMENSIONS,
    "ReferenceTexts": DIMENSIONS,
}
"""Each metric with the dimensions config/metrics.yaml must declare for it."""
UNSAFE = re.compile(r"[^\w.\- ]")


def label_value(label: str) -> str:
    """A label as a metric dimension: TorchServe's metric line splits on ``,``, ``:``, ``|``
    and ``#``, so anything but word characters, ``.``, ``-`` and spaces becomes ``_``."""
    return UNSAFE.sub("_", label)[:100] or "_"


def answer_labels(prediction: Prediction, head: str) -> list[str]:
    """The labels a text's answer gives (the module's docstring, by head)."""
    if head == "multi_label":
        return list(prediction.labels or []) or [NONE]
    if head == "one_logit":
        return [prediction.label] if prediction.score >= ONE_LOGIT_THRESHOLD else [NONE]
    if head == REGRESSION:
        return []
    return [prediction.label]


def uncertainty(prediction: Prediction, head: str) -> float | None:
    """1 - the confidence of the answer: the top score's, or for one logit the decision's."""
    if head == REGRESSION:
        return None
    if head == "one_logit":
        return min(prediction.score, 1.0 - prediction.score)
    return 1.0 - prediction.score


def tracked_labels(labels: Sequence[str], reference: dict[str, float] | None = None) -> set[str]:
    """The ``MAX_LABELS`` labels counted by name: the reference's most frequent, then by index."""
    if len(labels) <= MAX_LABELS:
        return {label_value(label) for label in labels}
    shares = reference or {}
    ranked = sorted(labels, key=lambda label: -shares.get(label_value(label), 0.0))
    return {label_value(label) for label in ranked[:MAX_LABELS]}


def label_counts(predictions: Iterable[Prediction], head: str, tracked: set[str]) -> dict[str, int]:
    """Answers by label, labels beyond ``tracked`` (and ``none``) folded into ``other``."""
    counts: Counter[str] = Counter()
    for prediction in predictions:
        for label in answer_labels(prediction, head):
            name = label_value(label)
            counts[name if name in tracked or name == NONE else OTHER] += 1
    return dict(counts)


def answered(predictions: Sequence[Prediction]) -> list[Prediction]:
    """The predictions that are answered as such: JSON cannot carry NaN or infinity."""
    return [p for p in predictions if isinstance(finite_or_rejected(p), Prediction)]


@dataclass(frozen=True)
class Profile:
    """The reference: what the model said on the user's texts, in the metrics' terms."""

    texts: int
    head: str
    label_shares: dict[str, float]
    uncertainty_mean: float | None
    truncated_share: float
    tokens_mean: float
    value_mean: float | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Profile:
        return cls(**json.loads(text))

    def gauges(self) -> list[tuple[str, float, list[str]]]:
        """(gauge, value, its leading dimension values before ``DIMENSIONS``)."""
        values: list[tuple[str, float, list[str]]] = [
            ("ReferenceLabelShare", share, [label])
            for label, share in sorted(self.label_shares.items())
        ]
        values += [
            ("ReferenceTruncatedShare", self.truncated_share, []),
            ("ReferenceTokensMean", self.tokens_mean, []),
            ("ReferenceTexts", self.texts, []),
        ]
        if self.uncertainty_mean is not None:
            values.append(("ReferenceUncertaintyMean", self.uncertainty_mean, []))
        if self.value_mean is not None:
            values.append(("ReferenceValueMean", self.value_mean, []))
        return values


def profile(
    predictions: Sequence[Prediction], tokens: Sequence[int], head: str, labels: Sequence[str]
) -> Profile:
    """The reference profile of ``predictions`` (with each text's tokens, truncated included)."""
    kept = answered(predictions)
    if not kept:
        raise ValueError("no reference text got a finite prediction; the profile would be empty")
    counts = label_counts(kept, head, {label_value(label) for label in labels})
    total = sum(counts.values())
    shares = {label: count / total for label, count in counts.items()} if total else {}
    tracked = tracked_labels(labels, shares)
    folded = label_counts(kept, head, tracked)
    doubts = [d for d in (uncertainty(p, head) for p in kept) if d is not None]
    return Profile(
        texts=len(kept),
        head=head,
        label_shares={label: round(count / total, 6) for label, count in folded.items()}
        if total
        else {},
        uncertainty_mean=round(sum(doubts) / len(doubts), 6) if doubts else None,
        truncated_share=round(sum(p.truncated for p in kept) / len(kept), 6),
        tokens_mean=round(sum(tokens) / len(tokens), 3) if tokens else 0.0,
        value_mean=round(sum(p.score for p in kept) / len(kept), 6) if head == REGRESSION else None,
    )


def read_profile(archive_dir: Path) -> Profile | None:
    path = archive_dir / PROFILE_FILE
    return Profile.from_json(path.read_text()) if path.is_file() else None


def batch_updates(
    predictions: Sequence[Prediction], head: str, tracked: set[str]
) -> list[tuple[str, float, list[str]]]:
    """One batch's (metric, value, leading dimension values): a counter increment per label
    present, then an observation per answered text."""
    kept = answered(predictions)
    updates: list[tuple[str, float, list[str]]] = [
        ("AnswersByLabel", count, [label])
        for label, count in label_counts(kept, head, tracked).items()
    ]
    if head == REGRESSION:
        return updates + [("RegressionValue", p.score, []) for p in kept]
    for prediction in kept:
        doubt = uncertainty(prediction, head)
        updates.append(("Uncertainty", round(max(doubt or 0.0, 0.0), 6), []))
    return updates


def declared_model_metrics(cache: Any) -> tuple[dict[str, Any], list[str]]:
    """Our model metrics the cache declares with our dimensions, and the others' names."""
    from ts.metrics.metric_type_enum import MetricTypes

    wanted = [(name, MetricTypes.COUNTER, dims) for name, dims in MODEL_COUNTERS.items()]
    wanted += [(name, MetricTypes.HISTOGRAM, dims) for name, dims in MODEL_HISTOGRAMS.items()]
    wanted += [(name, MetricTypes.GAUGE, dims) for name, dims in MODEL_GAUGES.items()]
    return declared_of(cache, wanted)


class ModelMetrics:
    """Emits what the model says per batch, and the reference profile once at start; checks
    what the metrics file declares once; a metrics failure never fails a batch."""

    def __init__(
        self,
        cache: Any,
        model_name: str,
        model_version: str,
        head: str,
        labels: Sequence[str],
        reference: Profile | None,
    ) -> None:
        self.dimensions = [model_name, model_version, LEVEL]
        self.head = head
        self.tracked = tracked_labels(labels, reference.label_shares if reference else None)
        self.metrics: dict[str, Any] = {}
        missing = [*MODEL_COUNTERS, *MODEL_HISTOGRAMS, *MODEL_GAUGES]
        if cache is not None:
            self.metrics, missing = declared_model_metrics(cache)
        if missing:
            logger.warning(
                "metrics file %s does not declare the model metrics %s, which are not emitted "
                "(config/metrics.yaml declares them; docs/handler.md, Metrics)",
                getattr(cache, "config_file_path", None) or "(none)",
                ", ".join(missing),
            )
        if reference is not None:
            self.send(reference.gauges())
        logger.info(
            "model metrics for a %s head, %d labels by name; reference profile: %s",
            head,
            len(self.tracked),
            f"{reference.texts} texts" if reference else "none in the archive",
        )

    def emit(self, predictions: Sequence[Prediction]) -> None:
        if not self.metrics:
            return
        try:
            self.send(batch_updates(predictions, self.head, self.tracked))
        except Exception:
            logger.warning("could not emit model metrics; this is a bug", exc_info=True)

    def send(self, updates: Sequence[tuple[str, float, list[str]]]) -> None:
        for name, value, leading in updates:
            metric = self.metrics.get(name)
            if metric is not None:
                metric.add_or_update(value, [*leading, *self.dimensions])
