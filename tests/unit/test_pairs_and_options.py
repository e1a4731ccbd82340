"""Text pairs and per-request options: decoded and checked per item, applied after the forward."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from handler.native import DEFAULT_OPTIONS, TextList, decode_request
from handler.pipeline import answer_batch
from handler.settings import HandlerSettings
from handler.values import (
    HTTP_STATUS,
    BatchStats,
    ErrorCode,
    IncomingRequest,
    Prediction,
    Rejected,
    ScoreOptions,
    TextInput,
    ValidText,
)

JSON = "application/json"
LIMIT = 20
MAX_TEXTS = HandlerSettings().max_texts_per_request


def decode(document: Any) -> Any:
    return decode_request({"body": json.dumps(document).encode()}, JSON, LIMIT, MAX_TEXTS)


def test_a_pair_decodes_with_its_second_text() -> None:
    assert decode({"text": "a premise", "text_pair": "a hypothesis"}) == ValidText(
        "a premise", "a hypothesis"
    )
    assert decode({"text": "alone"}) == ValidText("alone")


def test_list_items_may_be_pairs_or_texts() -> None:
    """In "texts" and KServe's "instances", pairs and single texts mix freely."""
    for field in ("texts", "instances"):
        result = decode({field: ["one", {"text": "two", "text_pair": "three"}, {"text": "four"}]})
        assert isinstance(result, TextList)
        assert result.items == (ValidText("one"), ValidText("two", "three"), ValidText("four"))


@pytest.mark.parametrize(
    ("pair", "code", "message"),
    [
        ("", ErrorCode.EMPTY_TEXT, "text_pair is empty or only white space"),
        (" \n\t", ErrorCode.EMPTY_TEXT, "text_pair is empty or only white space"),
        (5, ErrorCode.INVALID_TYPE, '"text_pair" must be a string, got a number'),
        (None, ErrorCode.INVALID_TYPE, '"text_pair" must be a string, got null'),
        (["a"], ErrorCode.INVALID_TYPE, '"text_pair" must be a string, got an array'),
        ({"text": "a"}, ErrorCode.INVALID_TYPE, '"text_pair" must be a string, got an object'),
        (
            "x" * (LIMIT + 1),
            ErrorCode.PAYLOAD_TOO_LARGE,
            "text_pair has 21 characters; the limit is 20",
        ),
        ("ok \ud800", ErrorCode.INVALID_ENCODING, "text_pair has a lone surrogate (U+D800)"),
    ],
)
def test_a_bad_text_pair_is_rejected_with_its_reason(
    pair: Any, code: ErrorCode, message: str
) -> None:
    """Empty, not a string, over the character limit or not valid Unicode: the same rules and
    codes as the text itself."""
    result = decode({"text": "a premise", "text_pair": pair})
    assert isinstance(result, Rejected) and result.code is code
    assert message in result.message


def test_a_bad_text_pair_in_a_list_fails_that_item_alone() -> None:
    result = decode(
        {
            "texts": [
                {"text": "a", "text_pair": 7},
                {"text": "b", "text_pair": ""},
                {"text": "c", "text_pair": "d"},
            ]
        }
    )
    assert isinstance(result, TextList)
    first, second, third = result.items
    assert isinstance(first, Rejected) and first.code is ErrorCode.INVALID_TYPE
    assert first.message == "texts[0].text_pair must be a string, got a number"
    assert isinstance(second, Rejected) and second.code is ErrorCode.EMPTY_TEXT
    assert third == ValidText("c", "d")


def test_the_text_is_checked_before_its_pair() -> None:
    result = decode({"text": "", "text_pair": 5})
    assert isinstance(result, Rejected) and result.code is ErrorCode.EMPTY_TEXT


def test_a_top_level_text_pair_next_to_a_list_is_refused() -> None:
    """It would be silently ignored otherwise: say where it goes."""
    result = decode({"texts": ["a"], "text_pair": "b"})
    assert isinstance(result, Rejected) and result.code is ErrorCode.INVALID_TYPE
    assert "inside each item" in result.message


@pytest.mark.parametrize(
    ("document", "options"),
    [
        ({"text": "a"}, DEFAULT_OPTIONS),
        ({"text": "a", "top_k": 2}, ScoreOptions(top_k=2)),
        ({"text": "a", "top_k": 10**9}, ScoreOptions(top_k=10**9)),
        ({"text": "a", "raw_scores": True}, ScoreOptions(raw_scores=True)),
        ({"text": "a", "raw_scores": False}, DEFAULT_OPTIONS),
        ({"text": "a", "text_pair": "b", "top_k": 1, "raw_scores": True}, ScoreOptions(1, True)),
    ],
)
def test_options_ride_with_the_text(document: dict[str, Any], options: ScoreOptions) -> None:
    result = decode(document)
    assert isinstance(result, ValidText) and result.options == options


def test_list_options_apply_to_every_item() -> None:
    result = decode({"instances": ["a", {"text": "b", "text_pair": "c"}], "top_k": 1})
    assert isinstance(result, TextList)
    assert [item.options for item in result.items] == [ScoreOptions(top_k=1)] * 2


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"text": "a", "top_k": 0}, '"top_k" must be a whole number of at least 1, got 0'),
        ({"text": "a", "top_k": -3}, "got -3"),
        ({"text": "a", "top_k": 1.5}, "got 1.5"),
        ({"text": "a", "top_k": "3"}, "got a string"),
        ({"text": "a", "top_k": True}, "got a boolean"),
        ({"text": "a", "top_k": None}, "got null"),
        ({"text": "a", "raw_scores": "yes"}, '"raw_scores" must be true or false, got a string'),
        ({"text": "a", "raw_scores": 1}, "got a number"),
        ({"text": "a", "raw_scores": None}, "got null"),
        ({"texts": ["a", "b"], "top_k": 0}, '"top_k" must be a whole number'),
        ({"instances": ["a"], "raw_scores": []}, "got an array"),
    ],
)
def test_a_bad_option_fails_its_request(document: dict[str, Any], message: str) -> None:
    """A bad option value is a 400 invalid_option for the whole request, list or not."""
    result = decode(document)
    assert isinstance(result, Rejected) and result.code is ErrorCode.INVALID_OPTION
    assert message in result.message
    assert HTTP_STATUS[ErrorCode.INVALID_OPTION] == (400, "Bad Request")


# --- in the pipeline, with a fake classifier ------------------------------------------------


class RecordingClassifier:
    """Scores each input by its length; records what each call received."""

    labels = ("a", "b", "c")

    def __init__(self) -> None:
        self.calls: list[list[TextInput]] = []

    def __call__(self, texts: Sequence[TextInput], *_: Any) -> tuple[list[Prediction], BatchStats]:
        self.calls.append(list(texts))
        predictions = []
        for text in texts:
            size = len(text) if isinstance(text, str) else len(text[0]) + 10 * len(text[1])
            scores = {"a": 0.2, "b": 0.5, "c": 0.3} if size % 2 else {"a": 0.6, "b": 0.1, "c": 0.3}
            raw = {label: score * 10 for label, score in scores.items()}
            best = max(scores, key=lambda label: scores[label])
            predictions.append(Prediction(best, scores[best], scores, False, None, raw))
        return predictions, BatchStats(texts=len(texts))


def request(document: Any, request_id: str) -> IncomingRequest:
    return IncomingRequest({"body": json.dumps(document).encode()}, JSON, request_id)


def test_pairs_and_options_share_one_classifier_call_and_answer_per_request() -> None:
    """Options never change what runs together: one call for every valid text and pair of
    the batch, in order; each request then gets its own shape."""
    classifier = RecordingClassifier()
    requests = [
        request({"text": "odd"}, "r0"),
        request({"text": "even", "text_pair": "x", "top_k": 1}, "r1"),
        request({"texts": ["odd", {"text": "pair", "text_pair": "yy"}], "raw_scores": True}, "r2"),
        request({"text": "odd", "top_k": "1"}, "r3"),
        request({"text": "ok", "text_pair": ""}, "r4"),
    ]
    responses = answer_batch(requests, classifier, HandlerSettings(max_chars=LIMIT))[0]
    assert classifier.calls == [["odd", ("even", "x"), "odd", ("pair", "yy")]]
    bodies = [json.loads(response.body) for response in responses]
    assert [response.status for response in responses] == [200, 200, 200, 400, 400]
    assert bodies[0]["scores"] == {"a": 0.2, "b": 0.5, "c": 0.3}
    assert bodies[1]["scores"] == {"a": 0.6} and bodies[1]["score"] == 0.6
    first, second = bodies[2]["results"]
    assert first["scores"] == {"a": 2.0, "b": 5.0, "c": 3.0} and first["score"] == 5.0
    assert second["scores"] == {"a": 6.0, "b": 1.0, "c": 3.0}
    assert bodies[3]["error"]["code"] == "invalid_option"
    assert bodies[4]["error"]["code"] == "empty_text"
    for body in bodies[:2]:
        assert set(body) == {"label", "score", "scores", "truncated", "request_id"}


def test_multi_label_answers_carry_labels() -> None:
    """labels is answered when the classifier gives it, and kept under top_k and raw_scores."""

    def classifier(texts: Sequence[TextInput], *_: Any) -> tuple[list[Prediction], BatchStats]:
        scores = {"x": 0.9, "y": 0.7, "z": 0.1}
        raw = {"x": 2.2, "y": 0.8, "z": -2.2}
        return [Prediction("x", 0.9, scores, False, ["x", "y"], raw) for _ in texts], BatchStats()

    responses = answer_batch(
        [request({"text": "t"}, "a"), request({"text": "t", "top_k": 1, "raw_scores": True}, "b")],
        classifier,
        HandlerSettings(max_chars=LIMIT),
    )[0]
    plain, shaped = (json.loads(response.body) for response in responses)
    assert plain["labels"] == shaped["labels"] == ["x", "y"]
    assert list(plain) == ["label", "score", "scores", "truncated", "labels", "request_id"]
    assert shaped["scores"] == {"x": 2.2} and shaped["score"] == 2.2


def test_form_fields_may_carry_a_pair() -> None:
    """curl --data-urlencode text=... --data-urlencode text_pair=...: the pair is not dropped."""
    form = "application/x-www-form-urlencoded"
    fields = {"text": b"It rains.", "text_pair": b"The street is wet."}
    assert decode_request(fields, form, LIMIT, MAX_TEXTS) == ValidText(
        "It rains.", "The street is wet."
    )
    for pair, code in [(b"", ErrorCode.EMPTY_TEXT), (b"\xff", ErrorCode.INVALID_ENCODING)]:
        result = decode_request({"text": b"fine", "text_pair": pair}, form, LIMIT, MAX_TEXTS)
        assert isinstance(result, Rejected) and result.code is code
    assert decode_request({"text": b"fine"}, form, LIMIT, MAX_TEXTS) == ValidText("fine")
