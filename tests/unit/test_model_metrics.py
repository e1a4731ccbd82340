"""What the model says as metrics: per head, what a batch adds, the label cap, the reference
profile and its gauges, each line as TorchServe's frontend parses it."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from handler.metrics import (
    MAX_LABELS,
    MODEL_COUNTERS,
    MODEL_GAUGES,
    MODEL_HISTOGRAMS,
    PROFILE_FILE,
    ModelMetrics,
    Profile,
    answer_labels,
    batch_updates,
    label_counts,
    label_value,
    profile,
    tracked_labels,
    uncertainty,
)
from handler.values import Prediction
from tests.conftest import ROOT
from tests.unit.test_metrics import FRONTEND_METRIC, FRONTEND_METRIC_LINE


def single(label: str, score: float, truncated: bool = False) -> Prediction:
    other = "negative" if label == "positive" else "positive"
    return Prediction(label, score, {label: score, other: 1 - score}, truncated)


def multi(labels: list[str], score: float) -> Prediction:
    return Prediction("a", score, {"a": score, "b": 0.3, "c": 0.1}, False, labels=labels)


BATCH = [single("positive", 0.9), single("negative", 0.75), single("positive", 0.99, True)]


def test_a_single_label_batch_counts_each_label_once_per_text_and_observes_each_doubt() -> None:
    updates = batch_updates(BATCH, "single_label", {"positive", "negative"})
    assert updates[:2] == [
        ("AnswersByLabel", 2, ["positive"]),
        ("AnswersByLabel", 1, ["negative"]),
    ]
    doubts = [value for name, value, _ in updates if name == "Uncertainty"]
    assert doubts == pytest.approx([0.1, 0.25, 0.01])


def test_each_head_answers_as_its_response_reads() -> None:
    assert answer_labels(multi(["a", "b"], 0.8), "multi_label") == ["a", "b"]
    assert answer_labels(multi([], 0.4), "multi_label") == ["none"]
    toxic = Prediction("toxic", 0.7, {"toxic": 0.7}, False)
    calm = Prediction("toxic", 0.2, {"toxic": 0.2}, False)
    assert answer_labels(toxic, "one_logit") == ["toxic"]
    assert answer_labels(calm, "one_logit") == ["none"]
    assert uncertainty(calm, "one_logit") == pytest.approx(0.2)
    assert uncertainty(toxic, "one_logit") == pytest.approx(0.3)
    value = Prediction("LABEL_0", 3.5, {"LABEL_0": 3.5}, False)
    assert answer_labels(value, "regression") == [] and uncertainty(value, "regression") is None
    assert batch_updates([value], "regression", set()) == [("RegressionValue", 3.5, [])]


def test_a_text_whose_scores_are_not_finite_is_not_counted() -> None:
    """It is answered 500 (``pipeline.finite_or_rejected``), so it is no answer."""
    broken = Prediction("positive", float("nan"), {"positive": float("nan")}, False)
    updates = batch_updates([broken, *BATCH], "single_label", {"positive", "negative"})
    assert sum(1 for name, *_ in updates if name == "Uncertainty") == len(BATCH)
    assert sum(v for name, v, _ in updates if name == "AnswersByLabel") == len(BATCH)


def test_many_labels_keep_the_reference_s_most_frequent_and_fold_the_rest() -> None:
    labels = [f"L{i}" for i in range(MAX_LABELS + 5)]
    assert tracked_labels(labels) == set(labels[:MAX_LABELS])
    frequent = {"L24": 0.5, "L23": 0.3}
    assert {"L24", "L23"} <= tracked_labels(labels, frequent)
    assert len(tracked_labels(labels, frequent)) == MAX_LABELS
    predictions = [single("L1", 0.9), single("L24", 0.9), single("L23", 0.8)]
    assert label_counts(predictions, "single_label", tracked_labels(labels)) == {
        "L1": 1,
        "other": 2,
    }


def test_a_label_becomes_a_value_the_metric_line_can_carry() -> None:
    assert label_value("very positive") == "very positive"
    assert label_value("a,b:c|d#e") == "a_b_c_d_e"
    assert label_value("") == "_"


def test_the_profile_holds_the_shares_the_doubt_and_the_truncation() -> None:
    found = profile(BATCH, [10, 20, 128], "single_label", ["negative", "positive"])
    assert found.texts == 3
    assert found.label_shares == pytest.approx({"positive": 2 / 3, "negative": 1 / 3}, abs=1e-6)
    assert found.uncertainty_mean == pytest.approx((0.1 + 0.25 + 0.01) / 3, abs=1e-6)
    assert found.truncated_share == pytest.approx(1 / 3, abs=1e-6)
    assert found.tokens_mean == pytest.approx(158 / 3, abs=1e-3)
    assert Profile.from_json(found.to_json()) == found
    regression = profile([Prediction("v", 2.0, {"v": 2.0}, False)], [5], "regression", ["v"])
    assert regression.value_mean == 2.0 and regression.uncertainty_mean is None
    assert regression.label_shares == {}
    with pytest.raises(ValueError, match="no reference text"):
        profile([], [], "single_label", ["a"])


@pytest.fixture()
def cache() -> MetricsCacheYamlImpl:
    metrics = MetricsCacheYamlImpl(config_file_path=str(ROOT / "config" / "metrics.yaml"))
    metrics.initialize_cache()
    metrics.model_name = "bert"
    return metrics


def metric_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, ...]]:
    """Each [METRICS] line as the frontend's patterns parse it (name, unit, value, dims, type)."""
    parsed = []
    for record in caplog.records:
        line = record.getMessage()
        if "[METRICS]" not in line:
            continue
        picked = FRONTEND_METRIC_LINE.fullmatch(line)
        assert picked, line
        fields = FRONTEND_METRIC.fullmatch(picked.group(3))
        assert fields, line
        parsed.append(fields.group(1, 3, 4, 6))
    return parsed


def test_metrics_yaml_declares_every_model_metric_and_the_frontend_parses_each_line(
    cache, caplog
) -> None:
    reference = profile(BATCH, [10, 20, 128], "single_label", ["negative", "positive"])
    with caplog.at_level(logging.INFO):
        metrics = ModelMetrics(
            cache, "bert", "1.0", "single_label", ["negative", "positive"], reference
        )
        metrics.emit(BATCH)
    assert "does not declare" not in caplog.text
    assert set(metrics.metrics) == {*MODEL_COUNTERS, *MODEL_HISTOGRAMS, *MODEL_GAUGES}
    lines = metric_lines(caplog)
    dims = "ModelName:bert,ModelVersion:1.0,Level:Model"
    assert ("ReferenceLabelShare", "0.666667", f"Label:positive,{dims}", "GAUGE") in lines
    assert ("ReferenceTexts", "3", dims, "GAUGE") in lines
    assert ("AnswersByLabel", "2", f"Label:positive,{dims}", "COUNTER") in lines
    assert ("Uncertainty", "0.25", dims, "HISTOGRAM") in lines
    assert len([line for line in lines if line[0] == "Uncertainty"]) == len(BATCH)


def test_without_a_cache_nothing_is_emitted_and_it_warns_once(caplog) -> None:
    with caplog.at_level(logging.INFO):
        metrics = ModelMetrics(None, "bert", "1.0", "single_label", ["a"], None)
        for _ in range(3):
            metrics.emit(BATCH)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "AnswersByLabel" in warnings[0].getMessage()
    assert "[METRICS]" not in caplog.text


def test_the_profile_file_is_json_with_the_fields_the_worker_reads() -> None:
    text = profile(BATCH, [1, 2, 3], "single_label", ["negative", "positive"]).to_json()
    assert set(json.loads(text)) == {
        "texts",
        "head",
        "label_shares",
        "uncertainty_mean",
        "truncated_share",
        "tokens_mean",
        "value_mean",
    }


def test_a_worker_exports_its_reference_at_start_and_counts_what_it_answered(
    tiny_model_dir, tmp_path, caplog
) -> None:
    """Through TorchServe's worker code: the archive's profile becomes gauges at start; the
    counters count the model's labels, also for requests whose options reshape the answer."""
    from tests.worker_harness import Sent, _load_service, _mar_folder, predict

    mar = _mar_folder(tmp_path, tiny_model_dir)
    reference = Profile(3, "single_label", {"negative": 0.25, "positive": 0.75}, 0.1, 0.0, 9.0)
    (mar / PROFILE_FILE).write_text(reference.to_json())
    bodies = [
        b'{"texts": ["a fine text", "another one", "   "]}',
        b'{"text": "raw please", "raw_scores": true, "top_k": 1}',
        b'{"text": "a third"}',
    ]
    with caplog.at_level(logging.INFO):
        worker = _load_service(mar)
        answers = predict(worker.service, [Sent(body, "application/json") for body in bodies])
    lines = metric_lines(caplog)
    dims = "ModelName:bert,ModelVersion:1.0,Level:Model"
    assert ("ReferenceLabelShare", "0.75", f"Label:positive,{dims}", "GAUGE") in lines
    answered: Counter[str] = Counter()
    for answer in answers:
        body = json.loads(answer.body)
        for item in body.get("results", [body]):
            if "label" in item:
                answered[item["label"]] += 1
    counted: Counter[str] = Counter()
    for name, value, dimensions, _ in lines:
        if name == "AnswersByLabel":
            counted[dimensions.split(",")[0].removeprefix("Label:")] += int(value)
    assert sum(answered.values()) == 4 and counted == answered
    assert len([line for line in lines if line[0] == "Uncertainty"]) == 4
