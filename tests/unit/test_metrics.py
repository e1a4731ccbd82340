"""The handler's metrics: what one batch adds, and that every name is declared for TorchServe."""

from __future__ import annotations

import logging

import pytest
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from handler.errors import ErrorCode
from handler.inference import BatchStats, Prediction
from handler.metrics import MetricsEmitter, batch_metrics, rejections_by_reason
from handler.protocol import Rejected
from tests.conftest import ROOT


def prediction(truncated: bool = False) -> Prediction:
    return Prediction("positive", 0.9, {"negative": 0.1, "positive": 0.9}, truncated)


OUTCOMES = [
    prediction(),
    Rejected(ErrorCode.EMPTY_TEXT, "x"),
    prediction(truncated=True),
    Rejected(ErrorCode.EMPTY_TEXT, "x"),
    Rejected(ErrorCode.INVALID_JSON, "x"),
]
STATS = BatchStats(
    texts=2,
    sub_batches=[1, 1],
    real_tokens=150,
    padded_tokens=200,
    tokenize_ms=1.5,
    forward_ms=20.0,
)


def test_one_batch_adds_the_right_amounts() -> None:
    assert batch_metrics(OUTCOMES, STATS) == {
        "Batches": 1,
        "BatchItems": 5,
        "SubBatches": 2,
        "ItemsAccepted": 2,
        "ItemsTruncated": 1,
        "RealTokens": 150,
        "PaddedTokens": 200,
        "TokenizeMs": 1.5,
        "ForwardMs": 20.0,
    }
    assert rejections_by_reason(OUTCOMES) == {"empty_text": 2, "invalid_json": 1}


@pytest.fixture()
def cache() -> MetricsCacheYamlImpl:
    metrics = MetricsCacheYamlImpl(config_file_path=str(ROOT / "config" / "metrics.yaml"))
    metrics.initialize_cache()
    metrics.model_name = "bert"
    metrics.set_request_ids({0: "r0"})
    return metrics


def test_every_metric_is_declared_and_emitted(cache, caplog) -> None:
    """TorchServe drops undeclared metrics silently: each one must reach the [METRICS] log."""
    with caplog.at_level(logging.INFO):
        MetricsEmitter(cache, "bert").emit(OUTCOMES, STATS)
    emitted = "\n".join(r.getMessage() for r in caplog.records if "[METRICS]" in r.getMessage())
    for name in batch_metrics(OUTCOMES, STATS):
        assert f"[METRICS]{name}." in emitted, name
    assert "ItemsRejected.Count:2|#Reason:empty_text,ModelName:bert,Level:Model" in emitted
    assert "could not emit" not in caplog.text


def test_a_broken_metrics_cache_never_fails_the_batch(caplog) -> None:
    class Broken:
        def get_metric(self, *args, **kwargs):
            raise RuntimeError("cache is broken")

    MetricsEmitter(Broken(), "bert").emit(OUTCOMES, STATS)
    MetricsEmitter(None, "bert").emit(OUTCOMES, STATS)
    assert "could not emit" in caplog.text
