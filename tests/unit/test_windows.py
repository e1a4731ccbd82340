"""Long texts as windows: the tokenizer's windows, their combination, the per-request limit
and the deadline, without TorchServe (through the worker: tests/unit/test_heads.py)."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from handler.deadline import Pace
from handler.inference import Windows, classify, classify_admitted, combine, tokenize_windows
from handler.model import load_model
from handler.native import decode_request
from handler.pipeline import answer_batch
from handler.settings import HandlerSettings
from handler.values import ErrorCode, IncomingRequest, TextInput, ValidText
from tests.architectures import ARCHITECTURES

WORDS = ["unaffable", "running", "a", "film", ",", "!", "don't", "héllo", "😀", "東京", "good"]
NOW = 1_700_000_000.0


def words(chooser: random.Random, count: int) -> str:
    return " ".join(chooser.choice(WORDS) for _ in range(count))


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
@pytest.mark.parametrize("side", ["right", "left"])
def test_windows_are_the_tokenizers_own(architecture_dir: Any, name: str, side: str) -> None:
    """Every architecture's tokenizer, both truncation sides: a text's windows equal
    transformers' return_overflowing_tokens with the stride; a pair's, only_second's with the
    first text whole; a pair whose first text leaves no room is cut longest first."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(architecture_dir(name))
    tokenizer.truncation_side = side
    chooser = random.Random(f"{name}-{side}")
    for _ in range(20):
        max_length, stride = chooser.choice([(32, 8), (33, 0), (64, 16)])
        text = words(chooser, chooser.randint(1, 150))
        pair = (words(chooser, chooser.randint(1, 3)), words(chooser, chooser.randint(1, 150)))
        first = len(tokenizer(pair[0], add_special_tokens=False)["input_ids"])
        if max_length - tokenizer.num_special_tokens_to_add(pair=True) - first <= stride:
            continue  # the tokenizer itself panics; the last case below covers such a pair
        ours = tokenize_windows(tokenizer, [text, pair], max_length, stride)
        theirs = [
            tokenizer(text, **options(max_length, stride, True)),
            tokenizer(*pair, **options(max_length, stride, "only_second")),
        ]
        for windows, expected in zip(ours, theirs, strict=True):
            assert [w.input_ids for w in windows] == expected["input_ids"], (text, pair)
            assert not any(w.truncated for w in windows)
            if "token_type_ids" in expected:
                assert [w.token_type_ids for w in windows] == expected["token_type_ids"]
    long_first = (words(chooser, 80), "the second")
    (cut,) = tokenize_windows(tokenizer, [long_first], 32, 8)
    assert len(cut) == 1 and cut[0].truncated
    truncated = tokenizer(*long_first, truncation=True, max_length=32)["input_ids"]
    assert cut[0].input_ids == truncated


def options(max_length: int, stride: int, truncation: Any) -> dict[str, Any]:
    return {
        "truncation": truncation,
        "max_length": max_length,
        "stride": stride,
        "return_overflowing_tokens": True,
    }


def test_combine_weights_windows_by_their_tokens() -> None:
    """The token-weighted mean of scores and of logits; the max per label; the most confident
    window (the first of equals); one window as is."""
    logits, scores, weights = [[1.0, -1.0], [3.0, 1.0]], [[0.8, 0.2], [0.4, 0.6]], [30, 10]
    assert combine(logits, scores, weights) == (
        pytest.approx([0.7, 0.3]),
        pytest.approx([1.5, -0.5]),
    )
    assert combine(logits, scores, weights, "max") == ([0.8, 0.6], [3.0, 1.0])
    assert combine(logits, scores, weights, "confident") == ([0.8, 0.2], [1.0, -1.0])
    assert combine([[0.0], [1.0]], [[0.5, 0.5], [0.5, 0.5]], [1, 1], "confident")[1] == [0.0]
    assert combine([[2.0, 1.0]], [[0.6, 0.4]], [7], "confident") == ([0.6, 0.4], [2.0, 1.0])


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> Any:
    return load_model(tiny_model_dir, HandlerSettings(device="cpu", max_batch_tokens=2048), None)


def test_short_texts_answer_the_same_with_windows_or_without(loaded: Any) -> None:
    """A text of one window is answered exactly as before (beside a long one, within float32's
    rounding of another padded width); a long one says its windows."""
    texts: list[TextInput] = ["a fine film", ("is it raining?", "the street is wet"), "bad " * 300]
    for short in texts[:2]:
        assert (
            classify(loaded, [short], 128, 2048)[0]
            == classify(loaded, [short], 128, 2048, Windows(32))[0]
        )
    cut, _ = classify(loaded, texts, 128, 2048)
    windowed, stats = classify(loaded, texts, 128, 2048, Windows(32))
    for before, after in zip(cut[:2], windowed[:2], strict=True):
        assert after.label == before.label and after.windows is None
        assert after.scores == pytest.approx(before.scores, abs=1e-6)
    assert cut[2].truncated and cut[2].windows is None
    # 300 words: 126 in the first window, 94 new in each next one (32 repeated), 80 in the last
    assert not windowed[2].truncated and windowed[2].windows == stats.windows[2] == 3
    assert stats.text_tokens[2] == 128 + 128 + (80 + 32 + 2)


class Counting:
    """A tokenizer's backend, counting the texts it encodes."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.encoded = backend, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def encode_batch(self, texts: Sequence[Any], **options: Any) -> Any:
        self.encoded += len(texts)
        return self.backend.encode_batch(texts, **options)


class WithBackend:
    """A tokenizer whose backend is ``backend``."""

    def __init__(self, tokenizer: Any, backend: Any) -> None:
        self.tokenizer, self.backend_tokenizer = tokenizer, backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def test_a_refused_text_is_tokenized_no_further_nor_forwarded(loaded: Any, monkeypatch) -> None:
    """``admit`` is asked after each chunk; the texts it refuses are not tokenized after that
    and answer None, the others are classified as alone."""
    monkeypatch.setattr("handler.inference.TOKENIZE_CHUNK_CHARS", 4_000)
    counting = Counting(loaded.tokenizer.backend_tokenizer)
    counted = dataclasses.replace(loaded, tokenizer=WithBackend(loaded.tokenizer, counting))
    texts = ["word " * 1_000] * 10 + ["a short one"]
    asked: list[bool] = []

    def admit(rows: Any, final: bool) -> set[int]:
        asked.append(final)
        return set(range(10)) if rows.get(0, 0) > 1 else set()

    predictions, stats = classify_admitted(
        counted, texts, 128, 2048, Windows(32), [True] * 11, admit
    )
    assert predictions[:10] == [None] * 10 and predictions[10] is not None
    assert counting.encoded <= 3 and asked[-1] is True
    alone, _ = classify(loaded, ["a short one"], 128, 2048, Windows(32))
    assert predictions[10] == alone[0]


def request(document: dict[str, Any], request_id: str, **headers: str) -> IncomingRequest:
    body = json.dumps(document).encode()
    return IncomingRequest({"body": body}, "application/json", request_id, headers)


def served(loaded: Any, settings: HandlerSettings) -> Any:
    windows = Windows(settings.stride)

    def classifier(texts: Sequence[TextInput], windowed: Sequence[bool], admit: Any) -> Any:
        return classify_admitted(loaded, texts, 128, 2048, windows, windowed, admit)

    return classifier


def test_a_request_past_its_windows_answers_413_and_its_batch_mates_are_answered(
    loaded: Any,
) -> None:
    """64 texts of max_chars (the hostile list) is refused with its reason; a short request and
    the same list with "windows": false in the same batch are answered."""
    settings = HandlerSettings()
    long = "word " * (settings.max_chars // 5)
    hostile = request({"texts": [long] * settings.max_texts_per_request}, "hostile")
    cut = request({"texts": [long] * 4, "windows": False}, "cut")
    short = request({"text": "a fine film"}, "short")
    responses, _ = answer_batch([hostile, cut, short], served(loaded, settings), settings)
    refused, truncated, answered = (json.loads(r.body) for r in responses)
    assert responses[0].status == 413
    assert refused["error"]["code"] == ErrorCode.PAYLOAD_TOO_LARGE.value
    assert "max_windows_per_request" in refused["error"]["message"]
    assert [entry["truncated"] for entry in truncated["results"]] == [True] * 4
    assert responses[2].status == 200 and "windows" not in answered


def test_one_long_text_of_max_chars_is_answered_with_its_windows(loaded: Any) -> None:
    """The worst text of max_chars (a token a character) fits the derived limit."""
    settings = HandlerSettings()
    responses, _ = answer_batch(
        [request({"text": "!" * settings.max_chars}, "long")], served(loaded, settings), settings
    )
    answer = json.loads(responses[0].body)
    assert responses[0].status == 200 and answer["truncated"] is False
    assert 2 < answer["windows"] <= settings.windows_per_request


def test_a_deadline_its_windows_cannot_meet_answers_504_unworked(loaded: Any) -> None:
    """At 0.05 s a row, 2 s cover one short text but not a long text's 4 windows... or 40:
    the long one answers 504 without a forward pass; the short one is answered."""
    settings = HandlerSettings()
    stamp = {"X-Request-Start": f"t={NOW}", "X-Request-Timeout": "1"}
    long = request({"text": "word " * 2_000}, "long", **stamp)
    short = request({"text": "a fine film"}, "short", **stamp)
    responses, _ = answer_batch(
        [long, short], served(loaded, settings), settings, now=NOW, pace=Pace(0.05)
    )
    assert [r.status for r in responses] == [504, 200]
    assert "windows" in json.loads(responses[0].body)["error"]["message"]


@pytest.mark.parametrize(
    ("document", "windows"),
    [
        ({"text": "x", "windows": True}, [True]),
        ({"texts": ["x", {"text": "y", "text_pair": "z"}], "windows": False}, [False, False]),
        ({"text": "x"}, [None]),
    ],
)
def test_the_request_option_reaches_each_text(document: dict[str, Any], windows: list) -> None:
    decoded = decode_request({"body": json.dumps(document).encode()}, "application/json", 100, 8)
    items = decoded.items
    assert [item.windows for item in items if isinstance(item, ValidText)] == windows


def test_a_windows_option_that_is_not_a_boolean_is_refused() -> None:
    decoded = decode_request(
        {"body": b'{"text": "x", "windows": "yes"}'}, "application/json", 100, 8
    )
    assert not isinstance(decoded, ValidText) and decoded.code == ErrorCode.INVALID_OPTION


def test_the_settings_bound_the_stride_and_derive_the_request_limit() -> None:
    assert HandlerSettings().stride == 32 and HandlerSettings(max_length=512).stride == 128
    # 10,000 one-character tokens: 126, then 94 new a window
    assert HandlerSettings().windows_per_request == 1 + -(-(10_000 - 126) // 94)
    assert HandlerSettings(max_chars=100).windows_per_request == 64
    assert HandlerSettings(max_windows_per_request=5).windows_per_request == 5
    with pytest.raises(ValueError, match="window_stride"):
        HandlerSettings(max_length=16, window_stride=7)
    with pytest.raises(ValueError, match="long_texts"):
        HandlerSettings(long_texts="split")


@pytest.mark.parametrize(
    ("kind", "multi_label"),
    [
        ("single_label", "mean"),
        ("multi_label", "mean"),
        ("multi_label", "max"),
        ("regression", "mean"),
    ],
)
def test_each_head_combines_as_documented(head_model_dir: Any, kind: str, multi_label: str) -> None:
    """In process, each head's combination equals the one recomputed with transformers
    (tests/heads.py ``windowed_scores``), max for multi-label included."""
    from tests.heads import ITEMS, reference_pipeline, windowed_scores

    model_dir = head_model_dir(kind, "tiny")
    loaded = load_model(model_dir, HandlerSettings(device="cpu", max_batch_tokens=2048), None)
    classifier = reference_pipeline(model_dir)
    long = [item for item in ITEMS if windowed_scores(classifier, item, 128, 32) is not None]
    predictions, stats = classify(loaded, long, 128, 2048, Windows(32, multi_label))
    assert len(long) >= 2 and all(count > 1 for count in stats.windows)
    for item, prediction in zip(long, predictions, strict=True):
        expected = windowed_scores(classifier, item, 128, 32, multi_label)
        assert expected is not None
        assert prediction.scores == pytest.approx(expected, abs=1e-5)
