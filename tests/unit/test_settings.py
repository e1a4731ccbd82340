"""Unit tests for handler.settings: defaults, validation, and the repository's own config."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from bert_serve_server.archive import BATCH_KEYS

from handler.settings import HandlerSettings, worker_threads

MODEL_CONFIG = Path(__file__).resolve().parents[2] / "config" / "model-config.yaml"


def test_defaults() -> None:
    """The documented defaults are the safe ones the handler relies on."""
    settings = HandlerSettings()
    assert settings.max_length == 128
    assert settings.max_chars == 10_000
    assert settings.max_batch_tokens == 0, "measured at worker start"
    assert settings.device == "auto"
    assert settings.torch_threads == 0
    assert settings.labels == ()


@pytest.mark.parametrize("raw", [None, {}])
def test_from_mapping_empty_gives_defaults(raw: dict[str, Any] | None) -> None:
    """A missing or empty handler section means all defaults."""
    assert HandlerSettings.from_mapping(raw) == HandlerSettings()


def test_from_mapping_reads_every_field() -> None:
    """Every known key is read and typed."""
    settings = HandlerSettings.from_mapping(
        {
            "max_length": 64,
            "max_chars": 500,
            "max_batch_tokens": 64,
            "device": "cpu",
            "torch_threads": 2,
            "labels": ["negative", "positive"],
            "max_texts_per_request": 8,
            "attention": "eager",
            "precision": "bf16",
            "pin_memory": False,
        }
    )
    assert settings == HandlerSettings(
        max_length=64,
        max_chars=500,
        max_batch_tokens=64,
        device="cpu",
        torch_threads=2,
        labels=("negative", "positive"),
        max_texts_per_request=8,
        attention="eager",
        precision="bf16",
        pin_memory=False,
    )


@pytest.mark.parametrize("labels", [["negative", "positive"], ("negative", "positive")])
def test_labels_become_a_tuple(labels: Any) -> None:
    """A yaml list of labels is stored as an immutable tuple."""
    settings = HandlerSettings.from_mapping({"labels": labels})
    assert settings.labels == ("negative", "positive")
    assert isinstance(settings.labels, tuple)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda"])
def test_valid_devices(device: str) -> None:
    """auto, cpu and cuda are accepted."""
    assert HandlerSettings.from_mapping({"device": device}).device == device


@pytest.mark.parametrize("key", ["batchSize", "max_lenght", "Max_Length", "labels "])
def test_unknown_key_is_rejected_by_name(key: str) -> None:
    """A typo or a TorchServe key in the handler section fails loudly, naming the key."""
    with pytest.raises(ValueError, match="unknown handler settings") as caught:
        HandlerSettings.from_mapping({key: 1})
    assert repr(key) in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("max_length", "128", id="string-for-int"),
        pytest.param("max_chars", 10.0, id="float-for-int"),
        pytest.param("max_batch_tokens", None, id="null-for-int"),
        pytest.param("torch_threads", True, id="bool-for-int"),
        pytest.param("max_length", False, id="false-for-int"),
        pytest.param("device", 0, id="int-for-string"),
        pytest.param("device", None, id="null-for-string"),
        pytest.param("device", ["cpu"], id="list-for-string"),
        pytest.param("labels", [0, 1], id="labels-of-ints"),
        pytest.param("labels", ["a", None], id="labels-with-null"),
        pytest.param("labels", "positive", id="labels-as-string"),
        pytest.param("labels", {"0": "a"}, id="labels-as-mapping"),
        pytest.param("labels", None, id="labels-null"),
    ],
)
def test_wrong_type_is_rejected(key: str, value: Any) -> None:
    """Each field only takes its own type; the message names the field."""
    with pytest.raises(ValueError, match=key):
        HandlerSettings.from_mapping({key: value})


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        pytest.param({"max_length": 7}, "max_length must be at least 8", id="max_length-7"),
        pytest.param({"max_length": 0}, "max_length", id="max_length-0"),
        pytest.param({"max_chars": 0}, "max_chars must be at least 1", id="max_chars-0"),
        pytest.param({"max_chars": -5}, "max_chars", id="max_chars-negative"),
        pytest.param(
            {"max_length": 256, "max_batch_tokens": 255}, "max_batch_tokens", id="budget-too-small"
        ),
        pytest.param({"max_batch_tokens": 127}, "max_batch_tokens", id="budget-below-default"),
        pytest.param({"max_batch_tokens": -1}, "max_batch_tokens", id="budget-negative"),
        pytest.param({"device": "gpu"}, "device must be one of", id="device-gpu"),
        pytest.param({"device": "CPU"}, "device", id="device-upper-case"),
        pytest.param({"device": "cuda:0"}, "device", id="device-indexed"),
        pytest.param({"torch_threads": -1}, "torch_threads", id="threads-negative"),
        pytest.param({"labels": ["a", "b", "a"]}, "labels must be unique", id="duplicate-labels"),
        pytest.param({"precision": "fp8"}, "precision must be one of", id="precision-fp8"),
        pytest.param({"precision": "BF16"}, "precision", id="precision-upper-case"),
    ],
)
def test_out_of_range_values_are_rejected(raw: dict[str, Any], match: str) -> None:
    """Values that could never work fail at worker start with a clear message."""
    with pytest.raises(ValueError, match=match):
        HandlerSettings.from_mapping(raw)


def test_boundary_values_are_accepted() -> None:
    """The smallest legal values (max_length 8, max_chars 1, budget == max_length) work."""
    settings = HandlerSettings.from_mapping(
        {"max_length": 8, "max_chars": 1, "max_batch_tokens": 8}
    )
    assert (settings.max_length, settings.max_chars, settings.max_batch_tokens) == (8, 1, 8)


def test_constructor_validates_too() -> None:
    """Building the dataclass directly runs the same range checks."""
    with pytest.raises(ValueError, match="max_length"):
        HandlerSettings(max_length=4)


def test_settings_are_frozen() -> None:
    """Settings cannot be changed after the worker has started."""
    settings = HandlerSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_chars = 1  # type: ignore[misc]


def test_repository_model_config_builds_valid_settings() -> None:
    """config/model-config.yaml's handler section is accepted as it ships."""
    config = yaml.safe_load(MODEL_CONFIG.read_text(encoding="utf-8"))
    assert isinstance(config, dict)
    assert isinstance(config.get("handler"), dict)
    settings = HandlerSettings.from_mapping(config["handler"])
    assert settings.max_chars >= 1
    assert settings.max_batch_tokens == 0, "the shipped config measures the budget at start"


@pytest.mark.parametrize("key", BATCH_KEYS)
def test_repository_model_config_has_no_batch_keys(key: str) -> None:
    """Batch and worker keys belong to config.properties; in the .mar config they would win."""
    config = yaml.safe_load(MODEL_CONFIG.read_text(encoding="utf-8"))
    assert key not in config


@pytest.mark.parametrize("function", ["auto", "softmax", "sigmoid", "none"])
def test_score_function_choices(function: str) -> None:
    """auto follows the model config; the others name the function for a silent config."""
    assert HandlerSettings.from_mapping({"score_function": function}).score_function == function


def test_score_function_choices_are_the_scoring_functions() -> None:
    from handler.model import AUTO, ScoreFunction
    from handler.settings import SCORE_FUNCTION_CHOICES

    assert SCORE_FUNCTION_CHOICES == (AUTO, *(function.value for function in ScoreFunction))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        pytest.param({"score_function": "Softmax"}, "score_function must be one of", id="case"),
        pytest.param({"score_function": "tanh"}, "score_function must be one of", id="unknown"),
        pytest.param({"score_function": None}, "score_function must be a string", id="null"),
        pytest.param({"multi_label_threshold": 1.5}, "between 0 and 1", id="over-1"),
        pytest.param({"multi_label_threshold": -0.1}, "between 0 and 1", id="negative"),
        pytest.param({"multi_label_threshold": float("nan")}, "between 0 and 1", id="nan"),
        pytest.param({"multi_label_threshold": "0.5"}, "must be a number", id="string"),
        pytest.param({"multi_label_threshold": True}, "must be a number", id="bool"),
    ],
)
def test_bad_score_settings_are_rejected(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HandlerSettings.from_mapping(raw)


@pytest.mark.parametrize(("value", "expected"), [(0, 0.0), (1, 1.0), (0.35, 0.35)])
def test_threshold_takes_whole_and_fractional_numbers(value: Any, expected: float) -> None:
    threshold = HandlerSettings.from_mapping({"multi_label_threshold": value}).multi_label_threshold
    assert threshold == expected and isinstance(threshold, float)


@pytest.mark.parametrize("value", [0.5, "1", True])
def test_whole_numbers_stay_whole(value: Any) -> None:
    with pytest.raises(ValueError, match="torch_threads must be an integer"):
        HandlerSettings.from_mapping({"torch_threads": value})


@pytest.mark.parametrize(
    "removed", ["queue_budget_ms", "share_idle_threads", "borrow_from_ms", "quantize_int8"]
)
def test_removed_settings_fail_at_start_by_name(removed: str) -> None:
    """A model config written for an older handler names the setting that is gone."""
    with pytest.raises(ValueError, match=f"unknown handler settings \\['{removed}'\\]"):
        HandlerSettings.from_mapping({removed: 1})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"explain_steps": 0}, "explain_steps must be >= 1"),
        ({"explain_max_tokens": 2}, "explain_max_tokens must be at least 3"),
        ({"explain_internal_batch_size": -1}, "explain_internal_batch_size must be >= 0"),
        ({"explain_steps": 2.5}, "explain_steps must be an integer"),
    ],
)
def test_explanation_settings_are_checked_at_start(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HandlerSettings.from_mapping(raw)


def test_explanation_defaults_are_the_stock_handlers_steps() -> None:
    settings = HandlerSettings()
    assert (settings.explain_steps, settings.explain_max_tokens) == (50, 128)
    assert settings.explain_internal_batch_size == 0


def test_a_worker_keeps_the_threads_its_start_sized() -> None:
    """torch_threads stated: those; OMP_NUM_THREADS set (the project's start): torch's, which
    read it (0: nothing set); neither (a plain torchserve --start, one worker per CPU): one."""
    assert worker_threads(3, {"OMP_NUM_THREADS": "1"}) == 3
    assert worker_threads(0, {"OMP_NUM_THREADS": "2"}) == 0
    assert worker_threads(0, {"OMP_NUM_THREADS": " "}) == 1
    assert worker_threads(0, {}) == 1
