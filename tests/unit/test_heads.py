"""Every kind of head answers what transformers' pipeline answers, alone and in any batch.

The reference is ``pipeline("text-classification", model=DIR, top_k=None)`` on the CPU in
fp32, run on the same folder for the same text or pair (truncated like the pipeline's
``truncation=True`` at the handler's ``max_length``). The largest difference per kind is
printed at the end of the module (``pytest tests/unit/test_heads.py -s``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.inference import classify, tokenize, with_options
from handler.model import LoadedModel, ScoreFunction, head_kind, load_model
from handler.settings import HandlerSettings
from handler.values import ScoreOptions, TextInput
from tests.heads import HEADS, ITEMS, SERVED_STRIDE, Reference, build_head_model, largest_difference
from tests.worker_harness import Sent, build_worker, predict

TOLERANCE = 1e-4
MAX_LENGTH = HandlerSettings().max_length
KINDS = [(kind, "tiny") for kind in HEADS] + [(kind, "minilm") for kind in HEADS]
EXPECTED_FUNCTION = {
    "single_label": ScoreFunction.SOFTMAX,
    "multi_label": ScoreFunction.SIGMOID,
    "one_logit": ScoreFunction.SIGMOID,
    "regression": ScoreFunction.NONE,
    "pair": ScoreFunction.SOFTMAX,
}

largest_seen: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def report_largest_differences() -> Iterator[None]:
    yield
    print("\nlargest |handler - transformers pipeline| per kind of model:")
    for name, difference in sorted(largest_seen.items()):
        print(f"  {name:24s} {difference:.2e}")


def record(name: str, got: dict[str, float], expected: dict[str, float]) -> None:
    difference = largest_difference(got, expected)
    largest_seen[name] = max(largest_seen.get(name, 0.0), difference)
    assert difference <= TOLERANCE, f"{name}: {got} vs the pipeline's {expected}"


def best_first(scores: dict[str, float]) -> list[str]:
    return sorted(scores, key=lambda label: scores[label], reverse=True)


@pytest.fixture(scope="module")
def models(
    head_model_dir: Callable[..., Path],
) -> Callable[[str, str], tuple[LoadedModel, Reference]]:
    loaded: dict[tuple[str, str], tuple[LoadedModel, Reference]] = {}

    def get(kind: str, encoder: str) -> tuple[LoadedModel, Reference]:
        if (kind, encoder) not in loaded:
            model_dir = head_model_dir(kind, encoder)
            loaded[kind, encoder] = (
                load_model(model_dir, HandlerSettings(), gpu_id=None),
                Reference(model_dir),
            )
        return loaded[kind, encoder]

    return get


@pytest.mark.parametrize(("kind", "encoder"), KINDS)
def test_scores_equal_the_pipeline_alone_together_and_in_length_groups(
    models, kind: str, encoder: str
) -> None:
    """Each text or pair, classified alone, in one padded batch of mixed lengths and in length
    groups, scores what the pipeline scores within 1e-4 (pairs in a model not trained on
    pairs included: the tokenizer handles them, as the pipeline's does)."""
    loaded, reference = models(kind, encoder)
    assert loaded.score_function is EXPECTED_FUNCTION[kind]
    assert head_kind(loaded) == ("single_label" if kind == "pair" else kind)
    together, stats = classify(loaded, ITEMS, MAX_LENGTH, 100_000)
    grouped, grouped_stats = classify(loaded, ITEMS, MAX_LENGTH, MAX_LENGTH)
    assert len(stats.sub_batches) == 1 and len(grouped_stats.sub_batches) > 1
    cut = [item for item, prediction in zip(ITEMS, together, strict=True) if prediction.truncated]
    assert cut == [ITEMS[4], ITEMS[5], ITEMS[8]]
    for index, item in enumerate(ITEMS):
        alone = classify(loaded, [item], MAX_LENGTH, 100_000)[0][0]
        for prediction in (alone, together[index], grouped[index]):
            record(f"{kind}/{encoder}", prediction.scores, reference(item))
            assert prediction.label == best_first(reference(item))[0]
            assert prediction.score == pytest.approx(
                reference(item)[prediction.label], abs=TOLERANCE
            )


@pytest.mark.parametrize(("kind", "encoder"), KINDS)
def test_raw_scores_are_the_pipeline_logits(
    head_model_dir, models, kind: str, encoder: str
) -> None:
    """raw_scores answers what the pipeline gives with function_to_apply="none"."""
    loaded, _ = models(kind, encoder)
    logits = Reference(head_model_dir(kind, encoder), function_to_apply="none")
    predictions, _ = classify(loaded, ITEMS, MAX_LENGTH, MAX_LENGTH)
    for item, prediction in zip(ITEMS, predictions, strict=True):
        raw = with_options(prediction, ScoreOptions(raw_scores=True))
        record(f"{kind}/{encoder} raw_scores", raw.scores, logits(item))
        assert raw.label == prediction.label and raw.score == raw.scores[raw.label]


def test_regression_answers_its_value(models) -> None:
    """A regression model's score is the raw value, the same as in scores: no function."""
    loaded, reference = models("regression", "tiny")
    predictions, _ = classify(loaded, ITEMS, MAX_LENGTH, 100_000)
    values = [prediction.score for prediction in predictions]
    assert any(value < 0 or value > 1 for value in values), values
    for item, prediction in zip(ITEMS, predictions, strict=True):
        assert prediction.scores == {"similarity": prediction.score}
        assert prediction.score == pytest.approx(reference(item)["similarity"], abs=TOLERANCE)
        assert prediction.labels is None


def test_one_logit_model_is_not_always_one(models) -> None:
    """A softmax over one logit would answer 1.0 for everything; the sigmoid does not."""
    loaded, _ = models("one_logit", "tiny")
    predictions, _ = classify(loaded, ITEMS, MAX_LENGTH, 100_000)
    scores = [prediction.score for prediction in predictions]
    assert all(0 < score < 1 for score in scores) and len(set(scores)) == len(scores)


@pytest.mark.parametrize("threshold", [0.5, 0.3, 0.8])
def test_multi_label_answers_every_label_over_the_threshold(
    head_model_dir, threshold: float
) -> None:
    """labels: every label whose sigmoid score is at least the threshold, best first; the
    scores themselves do not sum to 1."""
    model_dir = head_model_dir("multi_label", "minilm")
    loaded = load_model(model_dir, HandlerSettings(multi_label_threshold=threshold), None)
    reference = Reference(model_dir)
    predictions, _ = classify(loaded, ITEMS, MAX_LENGTH, 256)
    sizes = set()
    for item, prediction in zip(ITEMS, predictions, strict=True):
        expected = [
            label for label in best_first(reference(item)) if reference(item)[label] >= threshold
        ]
        assert prediction.labels == expected
        sizes.add(len(expected))
    assert sum(predictions[0].scores.values()) != pytest.approx(1.0, abs=1e-3)
    if threshold == 0.5:
        assert len(sizes) > 1, (
            "every item gave as many labels: the test would not see a bad threshold"
        )


@pytest.mark.parametrize("top_k", [1, 2, 3, 10])
def test_top_k_keeps_the_k_best_labels_best_first(models, top_k: int) -> None:
    """top_k keeps the pipeline's k best labels in scores, in its order; label and labels stay."""
    loaded, reference = models("multi_label", "tiny")
    predictions, _ = classify(loaded, ITEMS, MAX_LENGTH, 256)
    for item, prediction in zip(ITEMS, predictions, strict=True):
        cut = with_options(prediction, ScoreOptions(top_k=top_k))
        assert list(cut.scores) == best_first(reference(item))[:top_k]
        assert cut.label == prediction.label and cut.labels == prediction.labels
        both = with_options(prediction, ScoreOptions(top_k=top_k, raw_scores=True))
        assert list(both.scores) == list(cut.scores)


def test_pair_truncation_cuts_the_longer_text_like_the_pipeline(models) -> None:
    """A pair over max_length is cut longest-first at the end: a long premise loses its tail
    and a short hypothesis stays whole; it is flagged truncated and still equals the pipeline."""
    loaded, _ = models("pair", "tiny")
    premise, hypothesis = "premise " * 100, "the hypothesis stays whole"
    (item,) = tokenize(loaded.tokenizer, [(premise, hypothesis)], 32)
    expected = loaded.tokenizer(premise, hypothesis, truncation=True, max_length=32)
    assert (
        item.input_ids == expected["input_ids"]
        and item.token_type_ids == expected["token_type_ids"]
    )
    assert item.truncated and len(item.input_ids) == 32
    hypothesis_ids = loaded.tokenizer(hypothesis, add_special_tokens=False)["input_ids"]
    second = [i for i, t in zip(item.input_ids, item.token_type_ids, strict=True) if t == 1]
    assert second == [*hypothesis_ids, loaded.tokenizer.sep_token_id]


def test_one_tokenizer_call_for_a_mixed_batch(models) -> None:
    """A batch's tokenizer calls do not grow with its size: its pairs' sides in one call, the
    cut pairs in one (inference.tokenize_pairs), the singles in one; each equal to the
    tokenizer's own answer for that text or pair (ids and token type ids)."""
    loaded, _ = models("pair", "tiny")
    calls = []

    class Counting:
        """Stands in for the tokenizer (and its backend), counting encode_batch calls."""

        def __init__(self, wrapped: Any) -> None:
            self.wrapped = wrapped

        def __getattr__(self, name: str) -> Any:
            if name == "backend_tokenizer":
                return Counting(self.wrapped.backend_tokenizer)
            return getattr(self.wrapped, name)

        def encode_batch(self, items: list[Any], **kwargs: Any) -> Any:
            calls.append(len(items))
            return self.wrapped.encode_batch(items, **kwargs)

    tokenized = tokenize(Counting(loaded.tokenizer), ITEMS, MAX_LENGTH)
    pairs = sum(not isinstance(item, str) for item in ITEMS)
    assert pairs and calls == [2 * pairs, pairs, len(ITEMS) - pairs]
    for item, got in zip(ITEMS, tokenized, strict=True):
        text, pair = (item, None) if isinstance(item, str) else item
        expected = loaded.tokenizer(text, pair, truncation=True, max_length=MAX_LENGTH)
        assert got.input_ids == expected["input_ids"]
        assert got.token_type_ids == expected["token_type_ids"]


def test_model_without_token_types_matches_the_pipeline(tmp_path: Path) -> None:
    """A tokenizer without token type ids among its model inputs (DistilBERT, RoBERTa) gets
    none passed to the model, singles and pairs alike, as in the pipeline."""
    build_head_model(tmp_path, "pair", "tiny-distilbert")
    loaded = load_model(tmp_path, HandlerSettings(), None)
    assert not loaded.uses_token_types
    reference = Reference(tmp_path)
    predictions, _ = classify(loaded, ITEMS, MAX_LENGTH, MAX_LENGTH)
    for item, prediction in zip(ITEMS, predictions, strict=True):
        record("distilbert/tiny (no token types)", prediction.scores, reference(item))


@pytest.mark.parametrize(
    ("setting", "function"),
    [
        ("sigmoid", ScoreFunction.SIGMOID),
        ("none", ScoreFunction.NONE),
        ("softmax", ScoreFunction.SOFTMAX),
    ],
)
def test_score_function_setting_decides_for_a_config_that_says_nothing(
    head_model_dir, setting: str, function: ScoreFunction
) -> None:
    """A model saved without problem_type gets the setting's function, equal to the
    pipeline's function_to_apply; sigmoid over several labels answers labels too."""
    model_dir = head_model_dir("single_label", "tiny")
    assert json.loads((model_dir / "config.json").read_text()).get("problem_type") is None
    loaded = load_model(model_dir, HandlerSettings(score_function=setting), None)
    assert loaded.score_function is function
    reference = Reference(model_dir, function_to_apply=setting)
    predictions, _ = classify(loaded, ITEMS, MAX_LENGTH, 256)
    for item, prediction in zip(ITEMS, predictions, strict=True):
        record(f"single_label/tiny as {setting}", prediction.scores, reference(item))
        assert (prediction.labels is not None) == (function is ScoreFunction.SIGMOID)


@pytest.mark.parametrize(
    ("kind", "setting"), [("regression", "sigmoid"), ("multi_label", "softmax"), ("pair", "none")]
)
def test_score_function_setting_cannot_contradict_the_config(
    head_model_dir, kind: str, setting: str
) -> None:
    """A stated problem_type wins: a contradicting setting stops the worker with the reason."""
    with pytest.raises(ValueError, match="contradicts the model config"):
        load_model(head_model_dir(kind, "tiny"), HandlerSettings(score_function=setting), None)


def test_unknown_problem_type_is_a_start_error(head_model_dir, tmp_path: Path) -> None:
    import shutil

    model_dir = shutil.copytree(head_model_dir("single_label", "tiny"), tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "problem_type": "ranking"}))
    with pytest.raises(ValueError, match="problem_type 'ranking' is unknown"):
        load_model(model_dir, HandlerSettings(), None)


# --- through TorchServe's worker code -----------------------------------------------------


def as_json(document: Any) -> Sent:
    return Sent(json.dumps(document).encode(), "application/json")


def as_pair(item: TextInput) -> dict[str, str]:
    assert isinstance(item, tuple)
    return {"text": item[0], "text_pair": item[1]}


def mixed_requests() -> list[tuple[Sent, list[TextInput | None]]]:
    """Requests of every form with the items they carry (None: an item that must fail)."""
    pair, long_pair, single = ITEMS[2], ITEMS[5], ITEMS[1]
    return [
        (as_json({"text": single}), [single]),
        (as_json({"text": pair[0], "text_pair": pair[1]}), [pair]),
        (Sent(str(ITEMS[0]).encode()), [ITEMS[0]]),
        (
            as_json(
                {
                    "texts": [
                        ITEMS[4],
                        {"text": long_pair[0], "text_pair": long_pair[1]},
                        {"text": "ok", "text_pair": ""},
                        {"text": ITEMS[6]},
                    ]
                }
            ),
            [ITEMS[4], long_pair, None, ITEMS[6]],
        ),
        (
            as_json({"instances": [as_pair(ITEMS[7]), 3, as_pair(ITEMS[8])]}),
            [ITEMS[7], None, ITEMS[8]],
        ),
        (as_json({"text": "fine", "text_pair": 5}), [None]),
        (as_json({"text": "fine", "top_k": 0}), [None]),
        (as_json({"text": ITEMS[3][0], "text_pair": ITEMS[3][1]}), [ITEMS[3]]),
    ]


def answered_items(answer_body: dict[str, Any]) -> list[dict[str, Any]]:
    return answer_body.get("results") or answer_body.get("predictions") or [answer_body]


@pytest.mark.parametrize("kind", list(HEADS))
def test_worker_answers_each_item_like_the_pipeline_in_a_mixed_batch(
    head_model_dir, tmp_path: Path, kind: str
) -> None:
    """Singles, pairs, lists and bad items in one TorchServe batch: every valid item equals the
    pipeline and its answer when sent alone; each bad item fails alone."""
    model_dir = head_model_dir(kind, "tiny")
    service, _ = build_worker(tmp_path, model_dir)
    reference = Reference(model_dir, stride=SERVED_STRIDE)
    requests = mixed_requests()
    together = predict(service, [sent for sent, _ in requests])
    for (sent, items), answer in zip(requests, together, strict=True):
        alone = predict(service, [sent])[0]
        assert alone.status == answer.status
        entries = answered_items(json.loads(answer.body))
        alone_entries = answered_items(json.loads(alone.body))
        if items == [None]:
            assert answer.status == 400 and "error" in entries[0]
            continue
        assert answer.status == 200
        for item, entry, entry_alone in zip(items, entries, alone_entries, strict=True):
            if item is None:
                assert "error" in entry and entry == entry_alone
                continue
            record(f"{kind}/tiny via worker", entry["scores"], reference(item))
            assert entry["scores"] == pytest.approx(entry_alone["scores"], abs=TOLERANCE)
            assert entry["label"] == best_first(reference(item))[0]
            threshold = HandlerSettings().multi_label_threshold
            if kind == "multi_label":
                assert entry["labels"] == [
                    label
                    for label in best_first(reference(item))
                    if reference(item)[label] >= threshold
                ]
            else:
                assert "labels" not in entry


def test_worker_applies_options_per_request_in_one_forward(head_model_dir, tmp_path: Path) -> None:
    """Requests with and without top_k / raw_scores share one forward pass and each gets
    its own shape; a bad option value fails its own request only."""
    model_dir = head_model_dir("multi_label", "tiny")
    service, handler = build_worker(tmp_path, model_dir)
    reference, logits = Reference(model_dir), Reference(model_dir, function_to_apply="none")
    text = str(ITEMS[1])
    forwards = []
    original = handler.loaded.model.forward

    def counting_forward(*args, **kwargs):
        forwards.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    handler.loaded.model.forward = counting_forward
    sent = [
        as_json({"text": text}),
        as_json({"text": text, "top_k": 2}),
        as_json({"text": text, "raw_scores": True}),
        as_json({"texts": [text, {"text": "a", "text_pair": "b"}], "top_k": 1, "raw_scores": True}),
        as_json({"text": text, "raw_scores": "yes"}),
    ]
    answers = [json.loads(answer.body) for answer in predict(service, sent)]
    assert forwards == [5]
    expected = reference(text)
    assert answers[0]["scores"] == pytest.approx(expected, abs=TOLERANCE)
    assert list(answers[1]["scores"]) == best_first(expected)[:2]
    assert answers[2]["scores"] == pytest.approx(logits(text), abs=TOLERANCE)
    assert answers[2]["labels"] == answers[0]["labels"]
    first, second = answers[3]["results"]
    assert first["scores"] == pytest.approx(
        {first["label"]: logits(text)[first["label"]]}, abs=TOLERANCE
    )
    assert len(second["scores"]) == 1 and second["score"] == pytest.approx(
        logits(("a", "b"))[second["label"]], abs=TOLERANCE
    )
    assert answers[4]["error"]["code"] == "invalid_option"
