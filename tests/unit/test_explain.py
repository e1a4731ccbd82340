"""Explanations (handler/explain.py) against Captum's LayerIntegratedGradients run here directly.

The reference loads the folder with transformers alone (its own tokenizer and model classes),
builds the baseline (the same tokens, each non-special one replaced by the pad token) and runs
``LayerIntegratedGradients`` over ``model.get_input_embeddings()`` with the same steps, for
the default model and architectures with tokenizers of other kinds (tests/architectures.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from captum.attr import LayerIntegratedGradients
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from handler.explain import baseline_ids, explain, internal_batch_size
from handler.inference import tokenize
from handler.model import LoadedModel, load_model
from handler.precision import DTYPES, cpu_has_native_bf16
from handler.settings import HandlerSettings
from handler.values import ErrorCode, ExplainOptions, Explanation, Rejected

TEXTS = (
    "A wonderful, moving film with a great cast, though the ending drags.",
    "The plot was dull and the acting wooden; I left early.",
)
SETTINGS = HandlerSettings()


def reference(model_dir: Path, text: str, n_steps: int) -> tuple[list[str], list[float], int]:
    """Tokens, importances (summed over the hidden size, L2-normalised) and the predicted
    class, by transformers and Captum only."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    encoded = tokenizer(text, return_tensors="pt", return_special_tokens_mask=True)
    ids, special = encoded["input_ids"], encoded["special_tokens_mask"].bool()
    baseline = torch.where(special, ids, torch.full_like(ids, tokenizer.pad_token_id))
    mask = encoded["attention_mask"]
    with torch.no_grad():
        target = int(model(input_ids=ids, attention_mask=mask).logits.argmax(-1))

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    attributions = LayerIntegratedGradients(forward, model.get_input_embeddings()).attribute(
        ids, baselines=baseline, target=target, additional_forward_args=(mask,), n_steps=n_steps
    )
    summed = attributions.sum(dim=-1).squeeze(0)
    summed = summed / torch.linalg.vector_norm(summed)
    return tokenizer.convert_ids_to_tokens(ids[0]), summed.tolist(), target


def cosine(a: list[float], b: list[float]) -> float:
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float(x @ y / (x.norm() * y.norm()))


def top3(values: list[float]) -> list[int]:
    return sorted(range(len(values)), key=lambda i: values[i], reverse=True)[:3]


@pytest.fixture(scope="module")
def loaded(
    real_model_dir: Path, architecture_dir: Callable[[str], Path]
) -> Callable[[str], tuple[Path, LoadedModel]]:
    cache: dict[str, tuple[Path, LoadedModel]] = {}

    def get(name: str) -> tuple[Path, LoadedModel]:
        if name not in cache:
            folder = real_model_dir if name == "default" else architecture_dir(name)
            cache[name] = (folder, load_model(folder, SETTINGS, None))
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["default", "roberta", "albert", "deberta-v2"])
def test_importances_equal_captum_on_the_same_folder(loaded, name: str) -> None:
    """The default model (WordPiece), RoBERTa (byte-level BPE, <pad> = 1), ALBERT (Unigram,
    embeddings narrower than the hidden size) and DeBERTa-v2 (Unigram, eager attention)."""
    folder, model = loaded(name)
    for text in TEXTS:
        words, expected, target = reference(folder, text, SETTINGS.explain_steps)
        served = explain(model, text, ExplainOptions(), SETTINGS)
        assert isinstance(served, Explanation), served
        assert served.words == words
        assert served.label == model.labels[target]
        assert served.n_steps == SETTINGS.explain_steps
        assert cosine(served.importances, expected) >= 0.999
        assert top3(served.importances) == top3(expected)
        assert sum(v * v for v in served.importances) == pytest.approx(1.0, abs=1e-5)


def test_the_target_changes_the_explanation_and_names_its_label(loaded) -> None:
    _, model = loaded("default")
    text = "A wonderful, moving film with a great cast; I loved every minute."
    predicted = explain(model, text, ExplainOptions(), SETTINGS)
    by_name = explain(model, text, ExplainOptions(target="negative"), SETTINGS)
    by_index = explain(model, text, ExplainOptions(target=0), SETTINGS)
    assert isinstance(predicted, Explanation) and isinstance(by_name, Explanation)
    assert predicted.label == "positive" and by_name.label == "negative"
    assert by_index == by_name
    assert by_name.score == pytest.approx(1 - predicted.score, abs=1e-5)
    assert cosine(predicted.importances, by_name.importances) < 0.9


def test_fewer_steps_are_taken_and_more_than_the_cap_refused(loaded) -> None:
    _, model = loaded("roberta")
    few = explain(model, TEXTS[1], ExplainOptions(n_steps=5), SETTINGS)
    assert isinstance(few, Explanation) and few.n_steps == 5
    over = explain(model, TEXTS[1], ExplainOptions(n_steps=51), SETTINGS)
    assert isinstance(over, Rejected) and over.code == ErrorCode.INVALID_OPTION
    assert "at most 50" in over.message


@pytest.mark.parametrize("target", ["neither", 3, -1])
def test_an_unknown_target_is_refused_as_an_option(loaded, target: Any) -> None:
    _, model = loaded("roberta")
    refused = explain(model, TEXTS[0], ExplainOptions(target=target), SETTINGS)
    assert isinstance(refused, Rejected) and refused.code == ErrorCode.INVALID_OPTION


def test_a_text_over_explain_max_tokens_is_refused_before_any_pass(loaded) -> None:
    _, model = loaded("default")
    settings = replace(SETTINGS, explain_max_tokens=10)
    refused = explain(model, TEXTS[0], ExplainOptions(), settings)
    assert isinstance(refused, Rejected) and refused.code == ErrorCode.EXPLAIN_TOO_LONG
    assert "explain_max_tokens" in refused.message
    short = explain(model, "great film", ExplainOptions(), settings)
    assert isinstance(short, Explanation)


def test_a_pair_keeps_both_texts_and_their_separators(loaded) -> None:
    _, model = loaded("default")
    served = explain(model, ("a great film", "I loved it"), ExplainOptions(), SETTINGS)
    assert isinstance(served, Explanation)
    assert served.words.count("[SEP]") == 2 and served.words[0] == "[CLS]"
    assert len(served.importances) == len(served.words)


def test_the_baseline_keeps_only_the_special_tokens(loaded) -> None:
    _, model = loaded("roberta")
    (tokenized,) = tokenize(model.tokenizer, [("one text", "two")], SETTINGS.max_length)
    pad = model.tokenizer.pad_token_id
    baseline = baseline_ids(tokenized, pad)
    assert tokenized.special_tokens_mask is not None
    for token, base, special in zip(
        tokenized.input_ids, baseline, tokenized.special_tokens_mask, strict=True
    ):
        assert base == (token if special else pad)
    assert pad in baseline and baseline != tokenized.input_ids


def test_internal_batches_follow_the_token_budget_unless_set() -> None:
    assert internal_batch_size(HandlerSettings(), 256, 12) == 21
    assert internal_batch_size(HandlerSettings(), 256, 200) == 1
    assert internal_batch_size(HandlerSettings(explain_internal_batch_size=7), 256, 12) == 7


def test_internal_batches_do_not_change_the_importances(loaded) -> None:
    _, model = loaded("albert")
    one = explain(
        model, TEXTS[0], ExplainOptions(), replace(SETTINGS, explain_internal_batch_size=1)
    )
    all_steps = explain(
        model, TEXTS[0], ExplainOptions(), replace(SETTINGS, explain_internal_batch_size=50)
    )
    assert isinstance(one, Explanation) and isinstance(all_steps, Explanation)
    assert cosine(one.importances, all_steps.importances) >= 0.99999


def test_a_batch_over_its_time_budget_refuses_the_texts_it_cannot_fit(loaded) -> None:
    """The budget learns this worker's pace from the texts it explains; once what is left
    cannot hold the next text's estimate, that text answers explain_too_long, with numbers."""
    from handler.explain import Budget, explain_all

    _, model = loaded("roberta")
    budget = Budget.for_timeout(60)
    assert budget.seconds == 30 and budget.per_token_step is None
    budget.calibrate(model, SETTINGS)
    assert budget.per_token_step is not None and budget.per_token_step > 0
    items = [(text, ExplainOptions()) for text in TEXTS]
    assert all(isinstance(o, Explanation) for o in explain_all(model, items, SETTINGS, budget))
    tokens = len(tokenize(model.tokenizer, [TEXTS[0]], SETTINGS.max_length)[0].input_ids)
    estimate = budget.estimate(tokens, 50)
    tight = Budget(seconds=0.5 * estimate, per_token_step=budget.per_token_step)
    (refused,) = explain_all(model, [(TEXTS[0], ExplainOptions())], SETTINGS, tight)
    assert isinstance(refused, Rejected) and refused.code == ErrorCode.EXPLAIN_TOO_LONG
    assert "would take about" in refused.message and "responseTimeout" in refused.message
    assert tight.per_token_step is None  # timed again before its next batch
    tight = Budget(seconds=0.5 * estimate, per_token_step=budget.per_token_step)
    fewer = explain_all(model, [(TEXTS[0], ExplainOptions(n_steps=20))], SETTINGS, tight)
    assert isinstance(fewer[0], Explanation) and tight.per_token_step is not None


def test_a_workers_first_explanations_time_the_budget_inside_their_share(
    loaded, monkeypatch
) -> None:
    """A worker starts with its budget untimed; its first batch of explanations times one
    small explanation before the first text, and that time comes out of the batch's share."""
    import time

    from handler.explain import Budget, explain_all

    _, model = loaded("roberta")
    items = [(TEXTS[0], ExplainOptions())]
    budget = Budget.for_timeout(60)
    (explained,) = explain_all(model, items, SETTINGS, budget)
    assert isinstance(explained, Explanation)
    assert budget.per_token_step is not None and budget.per_token_step > 0

    def slow_calibration(self: Budget, *args: Any) -> None:
        time.sleep(0.3)
        self.per_token_step = 1e-12  # any text fits what is left but for the calibration's time

    monkeypatch.setattr(Budget, "calibrate", slow_calibration)
    (refused,) = explain_all(model, items, SETTINGS, Budget(seconds=0.1))
    assert isinstance(refused, Rejected) and refused.code == ErrorCode.EXPLAIN_TOO_LONG

    def failed_calibration(self: Budget, *args: Any) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(Budget, "calibrate", failed_calibration)
    untimed = Budget.for_timeout(60)
    (answered,) = explain_all(model, items, SETTINGS, untimed)
    assert isinstance(answered, Explanation) and untimed.per_token_step is not None


def test_the_fastest_timing_sets_the_pace_and_a_slow_spell_is_timed_again(
    loaded, monkeypatch
) -> None:
    """The budget is timed by CALIBRATION_RUNS small explanations and takes the fastest, so
    one run in a burst of load does not price every text out; and a pace that refused a text
    is timed again before the next batch, which then explains the text the burst refused."""
    import handler.explain as explain_module
    from handler.explain import CALIBRATION_RUNS, Budget, explain_all

    _, model = loaded("roberta")
    paces = iter([0.5, 1e-9, 0.2])  # the second run is the fastest
    calls = []

    def timed(loaded_model: Any, text: Any, options: Any, settings: Any, budget: Budget) -> Any:
        calls.append(text)
        budget.per_token_step = next(paces)

    monkeypatch.setattr(explain_module, "explain", timed)
    budget = Budget(seconds=30)
    budget.calibrate(model, SETTINGS)
    assert budget.per_token_step == 1e-9 and len(calls) == CALIBRATION_RUNS == 3
    monkeypatch.undo()

    slow = Budget(seconds=30, per_token_step=10.0)  # a pace timed in a burst: 10 s a token-step
    items = [(TEXTS[0], ExplainOptions(n_steps=4))]
    (refused,) = explain_all(model, items, SETTINGS, slow)
    assert isinstance(refused, Rejected) and refused.code == ErrorCode.EXPLAIN_TOO_LONG
    assert slow.per_token_step is None
    (explained,) = explain_all(model, items, SETTINGS, slow)
    assert isinstance(explained, Explanation) and 0 < (slow.per_token_step or 0) < 10.0


def test_explain_all_answers_a_model_failure_per_text(loaded, monkeypatch) -> None:
    import handler.explain
    from handler.explain import explain_all

    _, model = loaded("roberta")
    original = handler.explain.explain

    def broken(loaded_model: Any, text: Any, *rest: Any) -> Any:
        if text == "boom":
            raise RuntimeError("out of memory")
        return original(loaded_model, text, *rest)

    monkeypatch.setattr(handler.explain, "explain", broken)
    failed, fine = explain_all(
        model, [("boom", ExplainOptions()), ("fine", ExplainOptions())], SETTINGS
    )
    assert isinstance(failed, Rejected) and failed.code == ErrorCode.INTERNAL_ERROR
    assert isinstance(fine, Explanation)


def strict_json(body: str | bytes) -> Any:
    """Parse as JSON is: Python's json module would otherwise accept NaN and Infinity."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_explanation_is_refused_with_the_reason(
    loaded, monkeypatch, value: float
) -> None:
    """What bf16 or fp16 can produce; json.dumps would write it as NaN or Infinity."""
    import handler.explain

    _, model = loaded("default")
    monkeypatch.setattr(
        handler.explain, "summarize", lambda attributions: [value] * attributions.shape[1]
    )
    refused = explain(model, TEXTS[0], ExplainOptions(n_steps=4), SETTINGS)
    assert isinstance(refused, Rejected) and refused.code == ErrorCode.INTERNAL_ERROR
    assert "NaN or infinity" in refused.message and "float32" in refused.message


@pytest.mark.parametrize(
    ("device", "precision", "runs_here"),
    [
        ("cpu", "bf16", cpu_has_native_bf16()),
        ("cuda", "fp16", torch.cuda.is_available()),
        ("cuda", "bf16", torch.cuda.is_available() and torch.cuda.is_bf16_supported(False)),
    ],
)
def test_explanations_in_half_precision_are_finite_and_close_to_fp32(
    tiny_model_dir: Path, device: str, precision: str, runs_here: bool
) -> None:
    """A real run of the tiny BERT with its weights in bf16 (or fp16 on CUDA): finite numbers,
    strict JSON, and the same tokens matter as in fp32."""
    if not runs_here:
        pytest.skip(f"{precision} on {device} does not run on this machine")
    gpu_id = 0 if device == "cuda" else None
    exact = load_model(tiny_model_dir, HandlerSettings(device=device), gpu_id)
    fast = load_model(tiny_model_dir, HandlerSettings(device=device, precision=precision), gpu_id)
    assert fast.dtype == DTYPES[precision]
    for text in TEXTS:
        expected = explain(exact, text, ExplainOptions(n_steps=20), SETTINGS)
        served = explain(fast, text, ExplainOptions(n_steps=20), SETTINGS)
        assert isinstance(expected, Explanation) and isinstance(served, Explanation), served
        strict_json(json.dumps(asdict(served)))
        assert served.words == expected.words and served.label == expected.label
        assert cosine(served.importances, expected.importances) >= 0.95
