"""The handler's metrics: what one batch adds, and that every name is declared for TorchServe."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import ts
import yaml
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from handler.metrics import (
    BATCH_COUNTERS,
    COUNTER_DIMENSIONS,
    HISTOGRAMS,
    MetricsEmitter,
    batch_metrics,
    batch_observations,
    rejections_by_reason,
)
from handler.values import BatchStats, ErrorCode, Prediction, Rejected
from tests.conftest import ROOT
from tests.worker_harness import Sent, build_worker, predict

TORCHSERVE_METRICS = Path(ts.__file__).parent / "configs" / "metrics.yaml"
"""What a worker gets when config.properties has no metrics_config."""


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
    sub_batch_forward_ms=[12.0, 7.5],
    handler_ms=31.25,
    windows=[1, 3],
)


def test_one_batch_adds_the_right_amounts() -> None:
    assert batch_metrics(OUTCOMES, STATS) == {
        "Batches": 1,
        "BatchItems": 5,
        "SubBatches": 2,
        "ItemsAccepted": 2,
        "ItemsTruncated": 1,
        "ItemsWindowed": 1,
        "Windows": 4,
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
        MetricsEmitter(cache, "bert", "1.0").emit(OUTCOMES, STATS)
    emitted = "\n".join(r.getMessage() for r in caplog.records if "[METRICS]" in r.getMessage())
    for name in batch_metrics(OUTCOMES, STATS):
        assert f"[METRICS]{name}." in emitted, name
    assert (
        "ItemsRejected.Count:2|#Reason:empty_text,ModelName:bert,ModelVersion:1.0,Level:Model"
        in emitted
    )
    for line in [
        "HandlerSeconds.Seconds:0.03125|#ModelName:bert,ModelVersion:1.0,Level:Model|#type:HISTOGRAM",
        "ForwardSeconds.Seconds:0.012|#ModelName:bert,ModelVersion:1.0,Level:Model|#type:HISTOGRAM",
        "ForwardSeconds.Seconds:0.0075|#ModelName:bert,ModelVersion:1.0,Level:Model|#type:HISTOGRAM",
        "BatchSizeHundreds.Hundreds:0.05|#ModelName:bert,ModelVersion:1.0,Level:Model|#type:HISTOGRAM",
        "BatchTokensThousands.Thousands:0.2|#ModelName:bert,ModelVersion:1.0,Level:Model|#type:HISTOGRAM",
    ]:
        assert line in emitted, line
    assert "could not emit" not in caplog.text


FRONTEND_METRIC_LINE = re.compile(r"^(INFO > )?(\[METRICS])(.*)")
FRONTEND_METRIC = re.compile(
    r"\s*([\w\s]+)\.([\w\s]+):([0-9\-,.e]+)\|#([^|]*)(\|#type:([^|,]+))?"
    r"\|#hostname:([^,]+),([^,]+)(,(.*))?"
)
"""TorchServe 0.12's frontend reading a worker's stdout: ``WorkerLifeCycle.ReaderThread``'s
METRIC_PATTERN picks a line, ``Metric.PATTERN`` parses it (Java's ``matches``: whole line)."""


def test_each_update_is_a_line_the_frontend_parses(cache, caplog) -> None:
    """Through TorchServe's own metric objects: one line per update, in its format."""
    with caplog.at_level(logging.INFO):
        MetricsEmitter(cache, "bert", "1.0").emit(OUTCOMES, STATS)
    lines = [r.getMessage() for r in caplog.records if "[METRICS]" in r.getMessage()]
    rejections = len(rejections_by_reason(OUTCOMES))
    observations = sum(map(len, batch_observations(OUTCOMES, STATS).values()))
    assert len(lines) == len(BATCH_COUNTERS) + rejections + observations
    parsed = []
    for line in lines:
        picked = FRONTEND_METRIC_LINE.fullmatch(line)
        assert picked, line
        fields = FRONTEND_METRIC.fullmatch(picked.group(3))
        assert fields, line
        parsed.append(fields.group(1, 2, 3, 4, 6))
    assert (
        "ItemsRejected",
        "Count",
        "1",
        "Reason:invalid_json,ModelName:bert,ModelVersion:1.0,Level:Model",
        "COUNTER",
    ) in parsed
    assert (
        "ForwardSeconds",
        "Seconds",
        "0.0075",
        "ModelName:bert,ModelVersion:1.0,Level:Model",
        "HISTOGRAM",
    ) in parsed


def test_one_batch_observes_each_histogram_scaled_into_the_default_buckets() -> None:
    """Seconds, hundreds of requests, thousands of tokens; one value per forward pass."""
    assert batch_observations(OUTCOMES, STATS) == {
        "HandlerSeconds": [0.03125],
        "ForwardSeconds": [0.012, 0.0075],
        "BatchSizeHundreds": [0.05],
        "BatchTokensThousands": [0.2],
        "TextWindowsHundreds": [0.03],
    }
    assert tuple(batch_observations(OUTCOMES, STATS)) == HISTOGRAMS
    nothing_forwarded = batch_observations(OUTCOMES[1:2], BatchStats(handler_ms=2.0))
    assert nothing_forwarded["ForwardSeconds"] == [] == nothing_forwarded["BatchTokensThousands"]


def test_a_metrics_file_without_the_histograms_keeps_the_counters(tmp_path, caplog) -> None:
    """A metrics file from before the histograms: one warning naming them, counters still out."""
    declared = yaml.safe_load((ROOT / "config" / "metrics.yaml").read_text())
    del declared["model_metrics"]["histogram"]
    path = tmp_path / "metrics.yaml"
    path.write_text(yaml.safe_dump(declared))
    metrics = MetricsCacheYamlImpl(config_file_path=str(path))
    metrics.initialize_cache()
    with caplog.at_level(logging.INFO):
        emitter = MetricsEmitter(metrics, "bert", "1.0")
        for _ in range(3):
            emitter.emit(OUTCOMES, STATS)
    (warning,) = handler_warnings(caplog)
    assert "5 of the handler's 17 metrics" in warning and ", ".join(HISTOGRAMS) in warning
    assert caplog.text.count("[METRICS]Batches.") == 3 and "#type:HISTOGRAM" not in caplog.text


def test_the_counters_are_the_batch_metrics_and_the_rejections() -> None:
    assert [*BATCH_COUNTERS, "ItemsRejected"] == [*COUNTER_DIMENSIONS]
    assert tuple(batch_metrics(OUTCOMES, STATS)) == BATCH_COUNTERS


def handler_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_broken_or_missing_cache_warns_once_and_never_fails_a_batch(caplog) -> None:
    class Broken:
        config_file_path = "broken.yaml"

        def get_metric(self, *args, **kwargs):
            raise RuntimeError("cache is broken")

    for cache in (Broken(), None):
        caplog.clear()
        emitter = MetricsEmitter(cache, "bert", "1.0")
        for _ in range(3):
            emitter.emit(OUTCOMES, STATS)
        assert len(handler_warnings(caplog)) == 1, handler_warnings(caplog)
        assert "Batches, BatchItems" in handler_warnings(caplog)[0]
        assert "[METRICS]" not in caplog.text


def test_a_metric_declared_with_other_dimensions_is_named_and_left_out(tmp_path, caplog) -> None:
    """A declaration that differs from ours would fail each update: checked once instead."""
    declared = yaml.safe_load((ROOT / "config" / "metrics.yaml").read_text())
    for metric in declared["model_metrics"]["counter"]:
        if metric["name"] == "ItemsRejected":
            metric["dimensions"] = ["ModelName", "Level"]
    path = tmp_path / "metrics.yaml"
    path.write_text(yaml.safe_dump(declared))
    metrics = MetricsCacheYamlImpl(config_file_path=str(path))
    metrics.initialize_cache()
    with caplog.at_level(logging.INFO):
        emitter = MetricsEmitter(metrics, "bert", "1.0")
        emitter.emit(OUTCOMES, STATS)
    (warning,) = handler_warnings(caplog)
    assert str(path) in warning and "1 of the handler's 17 metrics" in warning
    assert (
        "ItemsRejected (dimensions must be ['Reason', 'ModelName', 'ModelVersion', 'Level'])"
        in warning
    )
    assert "[METRICS]Batches." in caplog.text and "[METRICS]ItemsRejected" not in caplog.text


def test_served_with_torchserve_default_metrics_a_worker_answers_and_warns_once_per_emitter(
    tiny_model_dir, tiny_worker, tmp_path, caplog
) -> None:
    """A config.properties without metrics_config gives the worker TorchServe's own
    metrics.yaml, which declares none of ours: through TorchServe's worker code the answers
    are the usual ones, one warning at start names the file and the counters, and no batch
    logs a MetricsCacheKeyError (each one did, with a stack trace)."""
    sent = [Sent(b"a fine text"), Sent(b"   "), Sent(b"another fine text")]
    with caplog.at_level(logging.INFO):
        worker = build_worker(tmp_path, tiny_model_dir, metrics_config=TORCHSERVE_METRICS)
        answers = [predict(worker.service, sent) for _ in range(3)]
    usual = predict(tiny_worker().service, sent)
    for batch in answers:
        assert [(a.status, json.loads(a.body)) for a in batch] == [
            (a.status, json.loads(a.body)) for a in usual
        ]
    assert [a.status for a in usual] == [200, 400, 200]
    metric_warnings = [w for w in handler_warnings(caplog) if "metric" in w.lower()]
    assert len(metric_warnings) == 2, metric_warnings  # the serving and the model metrics
    assert all(str(TORCHSERVE_METRICS) in warning for warning in metric_warnings)
    assert "17 of the handler's 17 metrics" in metric_warnings[0]
    assert "AnswersByLabel" in metric_warnings[1]
    assert "MetricsCacheKeyError" not in caplog.text
    assert "[METRICS]Batches" not in caplog.text
