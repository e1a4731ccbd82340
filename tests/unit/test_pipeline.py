"""Unit tests for handler.pipeline: one response per request, at its own index, whatever happens."""

from __future__ import annotations

import json
import string
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from handler import pipeline
from handler.inference import OutOfMemory, to_prediction, with_options
from handler.model import ScoreFunction, apply_score_function
from handler.pipeline import answer_batch, classify_valid
from handler.protocol import validate_text
from handler.settings import HandlerSettings
from handler.values import (
    BatchStats,
    ErrorCode,
    IncomingRequest,
    ListOutcome,
    Prediction,
    Rejected,
    Response,
    ScoreOptions,
    ValidText,
)

MAX_CHARS = 30
SETTINGS = HandlerSettings(max_chars=MAX_CHARS)
SUCCESS_KEYS = {"label", "score", "scores", "truncated", "request_id"}


def fake_label(text: str) -> str:
    return "positive" if len(text) % 2 == 0 else "negative"


def fake_score(text: str) -> float:
    """A per-text fingerprint, so a response carried to the wrong index is noticed."""
    return 0.5 + (zlib.crc32(text.encode("utf-8")) % 500) / 1000


def fake_prediction(text: str) -> Prediction:
    label = fake_label(text)
    other = "negative" if label == "positive" else "positive"
    score = fake_score(text)
    return Prediction(
        label=label, score=score, scores={label: score, other: 1 - score}, truncated=False
    )


class FakeClassifier:
    """Labels each text by the parity of its length; records every call."""

    def __init__(self, *, error: Exception | None = None, drop: int = 0, extra: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.error = error
        self.drop = drop
        self.extra = extra

    def __call__(self, texts: Sequence[str], *_: Any) -> tuple[list[Prediction], BatchStats]:
        self.calls.append(list(texts))
        if self.error is not None:
            raise self.error
        predictions = [fake_prediction(text) for text in texts]
        predictions = predictions[: len(predictions) - self.drop]
        predictions += [fake_prediction("extra")] * self.extra
        return predictions, BatchStats(texts=len(texts), sub_batches=[len(texts)])


def json_request(document: Any, request_id: str) -> IncomingRequest:
    return IncomingRequest({"body": json.dumps(document).encode()}, "application/json", request_id)


def raw_request(
    body: bytes, request_id: str, content_type: str | None = "text/plain"
) -> IncomingRequest:
    return IncomingRequest({"body": body}, content_type, request_id)


def body_of(response: Response) -> dict[str, Any]:
    assert isinstance(response.body, str)
    decoded = json.loads(response.body)
    assert isinstance(decoded, dict)
    return decoded


def assert_success(response: Response, request_id: str, text: str) -> None:
    body = body_of(response)
    assert (response.status, response.phrase) == (200, "OK")
    assert set(body) == SUCCESS_KEYS
    assert body["label"] == fake_label(text)
    assert body["score"] == fake_score(text)
    assert body["scores"][fake_label(text)] == fake_score(text)
    assert body["truncated"] is False
    assert body["request_id"] == request_id


def assert_error(response: Response, request_id: str, status: int, code: ErrorCode) -> None:
    body = body_of(response)
    assert response.status == status
    assert set(body) == {"error", "request_id"}
    assert set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code.value
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["request_id"] == request_id


# index -> (request, expected status, expected code or None for success, valid text)
MIXED = [
    (json_request({"text": "a fine film"}, "r0"), 200, None, "a fine film"),
    (json_request({"text": "   "}, "r1"), 400, ErrorCode.EMPTY_TEXT, None),
    (raw_request(b"plain text body", "r2"), 200, None, "plain text body"),
    (raw_request(b"x" * (MAX_CHARS + 1), "r3"), 413, ErrorCode.PAYLOAD_TOO_LARGE, None),
    (raw_request(b"bad \xff bytes", "r4"), 400, ErrorCode.INVALID_ENCODING, None),
    (raw_request(b'{"text": ', "r5", "application/json"), 400, ErrorCode.INVALID_JSON, None),
    (
        IncomingRequest({}, "application/x-www-form-urlencoded", "r6"),
        400,
        ErrorCode.MISSING_FIELD,
        None,
    ),
    (json_request({"text": 5}, "r7"), 400, ErrorCode.INVALID_TYPE, None),
    (
        IncomingRequest({"text": b"form field!"}, "multipart/form-data", "r8"),
        200,
        None,
        "form field!",
    ),
]


def mixed_requests() -> list[IncomingRequest]:
    return [request for request, *_ in MIXED]


def test_mixed_batch_answers_each_request_at_its_index() -> None:
    """Good and bad items in one batch each get their own status and body shape, in order."""
    classifier = FakeClassifier()
    responses = answer_batch(mixed_requests(), classifier, SETTINGS)[0]
    assert len(responses) == len(MIXED)
    for response, (request, status, code, text) in zip(responses, MIXED, strict=True):
        if code is None:
            assert_success(response, request.request_id, text)
        else:
            assert_error(response, request.request_id, status, code)


def test_error_phrases_match_statuses() -> None:
    """400 answers Bad Request and 413 answers Payload Too Large."""
    responses = answer_batch(mixed_requests(), FakeClassifier(), SETTINGS)[0]
    phrases = {response.status: response.phrase for response in responses}
    assert phrases == {200: "OK", 400: "Bad Request", 413: "Payload Too Large"}


def test_classifier_called_once_with_only_valid_texts_in_order() -> None:
    """The model sees the valid texts only, once per batch, in request order."""
    classifier = FakeClassifier()
    answer_batch(mixed_requests(), classifier, SETTINGS)[0]
    assert classifier.calls == [["a fine film", "plain text body", "form field!"]]


def test_batch_of_only_bad_items_never_calls_classifier() -> None:
    """When nothing is valid, no forward pass runs and every item keeps its 4xx."""
    bad = [(request, status, code) for request, status, code, _ in MIXED if code is not None]
    classifier = FakeClassifier()
    responses = answer_batch([request for request, *_ in bad], classifier, SETTINGS)[0]
    assert classifier.calls == []
    for response, (request, status, code) in zip(responses, bad, strict=True):
        assert_error(response, request.request_id, status, code)


def test_empty_batch() -> None:
    """An empty batch answers nothing and never calls the model."""
    classifier = FakeClassifier()
    assert answer_batch([], classifier, SETTINGS)[0] == []
    assert classifier.calls == []


@pytest.mark.parametrize(
    "error", [RuntimeError("CUDA out of memory"), ValueError("x"), MemoryError()]
)
def test_classifier_failure_gives_500_to_valid_items_only(error: Exception) -> None:
    """A model that fails on every text answers 500 to the valid items, each after a try
    alone; the bad items keep their own 4xx."""
    classifier = FakeClassifier(error=error)
    responses = answer_batch(mixed_requests(), classifier, SETTINGS)[0]
    valid = [text for *_, text in MIXED if text is not None]
    assert classifier.calls == [valid] + [[text] for text in valid]
    for response, (request, status, code, _) in zip(responses, MIXED, strict=True):
        if code is None:
            assert_error(response, request.request_id, 500, ErrorCode.INTERNAL_ERROR)
            assert response.phrase == "Internal Server Error"
        else:
            assert_error(response, request.request_id, status, code)


@pytest.mark.parametrize(("drop", "extra"), [(1, 0), (3, 0), (0, 1)])
def test_wrong_prediction_count_gives_500_to_valid_items_only(drop: int, extra: int) -> None:
    """Too few or too many predictions is a bug: the valid items get 500, the bad keep their 4xx."""
    responses = answer_batch(mixed_requests(), FakeClassifier(drop=drop, extra=extra), SETTINGS)[0]
    assert len(responses) == len(MIXED)
    for response, (request, status, code, _) in zip(responses, MIXED, strict=True):
        if code is None:
            assert_error(response, request.request_id, 500, ErrorCode.INTERNAL_ERROR)
        else:
            assert_error(response, request.request_id, status, code)


class PoisonClassifier(FakeClassifier):
    """Fails any call that holds the text "poison", as a model can fail on one input."""

    def __call__(self, texts: Sequence[str], *_: Any) -> tuple[list[Prediction], BatchStats]:
        if "poison" in texts:
            self.calls.append(list(texts))
            raise RuntimeError("index out of range in self")
        return super().__call__(texts)


def test_a_text_that_breaks_the_model_fails_alone() -> None:
    """The batch is classified again text by text: the poison text answers 500, and its
    batch-mates their own predictions."""
    texts = ["a fine film", "poison", "a dull film"]
    requests = [json_request({"text": text}, f"r{i}") for i, text in enumerate(texts)]
    classifier = PoisonClassifier()
    responses = answer_batch(requests, classifier, SETTINGS)[0]
    assert_success(responses[0], "r0", texts[0])
    assert_error(responses[1], "r1", 500, ErrorCode.INTERNAL_ERROR)
    assert_success(responses[2], "r2", texts[2])
    assert classifier.calls == [texts, *([text] for text in texts)]


def test_an_out_of_memory_batch_is_not_retried_text_by_text() -> None:
    """Memory is the batch's, not a text's: retrying each alone would only repeat it."""
    classifier = FakeClassifier(error=OutOfMemory("out of memory on 2 texts"))
    responses = answer_batch(
        [json_request({"text": "a"}, "r0"), json_request({"text": "b"}, "r1")], classifier, SETTINGS
    )[0]
    assert len(classifier.calls) == 1
    for response, request_id in zip(responses, ["r0", "r1"], strict=True):
        assert_error(response, request_id, 500, ErrorCode.INTERNAL_ERROR)
        assert "out of memory" in body_of(response)["error"]["message"]


def test_classify_valid_puts_results_back_at_their_indices() -> None:
    """Predictions go to the valid positions, rejections stay where they were."""
    rejected = Rejected(ErrorCode.EMPTY_TEXT, "text is empty or only white space")
    decoded = [rejected, ValidText("odd"), rejected, ValidText("even"), ValidText("x")]
    classifier = FakeClassifier()
    outcomes, stats, owners = classify_valid(decoded, classifier)
    assert classifier.calls == [["odd", "even", "x"]]
    assert owners == [1, 3, 4]
    assert outcomes == [
        rejected,
        ListOutcome(decoded[1], (fake_prediction("odd"),)),
        rejected,
        ListOutcome(decoded[3], (fake_prediction("even"),)),
        ListOutcome(decoded[4], (fake_prediction("x"),)),
    ]
    assert stats == BatchStats(texts=3, sub_batches=[3])


def test_classify_valid_without_valid_items() -> None:
    """Only rejections: outcomes are the rejections, stats are empty, no call is made."""
    rejected = Rejected(ErrorCode.INVALID_JSON, "bad")
    classifier = FakeClassifier()
    outcomes, stats, owners = classify_valid([rejected, rejected], classifier)
    assert outcomes == [rejected, rejected] and owners == []
    assert stats == BatchStats()
    assert classifier.calls == []


def test_classify_valid_classifier_failure() -> None:
    """A raising classifier turns the valid items into internal_error and counts them."""
    rejected = Rejected(ErrorCode.EMPTY_TEXT, "empty")
    outcomes, stats, _ = classify_valid(
        [ValidText("a"), rejected, ValidText("b")], FakeClassifier(error=RuntimeError("boom"))
    )
    first, second, third = outcomes
    assert isinstance(first, ListOutcome) and isinstance(third, ListOutcome)
    assert isinstance(first.items[0], Rejected) and first.items[0].code is ErrorCode.INTERNAL_ERROR
    assert second is rejected
    assert isinstance(third.items[0], Rejected) and third.items[0].code is ErrorCode.INTERNAL_ERROR
    assert stats.texts == 2


def test_responses_are_json_strings() -> None:
    """Every response body is a str that parses back to a JSON object."""
    for response in answer_batch(mixed_requests(), FakeClassifier(), SETTINGS)[0]:
        assert isinstance(response.body, str)
        assert isinstance(json.loads(response.body), dict)


def test_request_ids_are_echoed_per_item() -> None:
    """Each response carries its own request's id, even when the texts are identical."""
    requests = [json_request({"text": "same text"}, f"id-{i}") for i in range(5)]
    responses = answer_batch(requests, FakeClassifier(), SETTINGS)[0]
    assert [body_of(r)["request_id"] for r in responses] == [f"id-{i}" for i in range(5)]


def test_unicode_text_round_trips_through_the_response() -> None:
    """Non-ASCII texts are classified and the response stays valid JSON."""
    classifier = FakeClassifier()
    responses = answer_batch([json_request({"text": "très bien 😀"}, "u")], classifier, SETTINGS)[0]
    assert classifier.calls == [["très bien 😀"]]
    assert_success(responses[0], "u", "très bien 😀")


def tokenizer_like_classifier(texts: Sequence[str], *_: Any) -> tuple[list[Prediction], BatchStats]:
    """Like the real fast tokenizer, fails the whole batch on a text it cannot encode."""
    for text in texts:
        text.encode("utf-8")
    return [fake_prediction(text) for text in texts], BatchStats(texts=len(texts))


def test_lone_surrogate_item_does_not_fail_its_batch_mates() -> None:
    """One request with a JSON \\ud800 escape must not turn its batch-mates into 500s."""
    requests = [
        json_request({"text": "good"}, "ok"),
        raw_request(b'{"text": "bad \\ud800"}', "bad", "application/json"),
    ]
    responses = answer_batch(requests, tokenizer_like_classifier, SETTINGS)[0]
    assert_success(responses[0], "ok", "good")
    assert_error(responses[1], "bad", 400, ErrorCode.INVALID_ENCODING)


# --- property: no response is lost or shuffled ----------------------------------------------

ascii_text = st.text(alphabet=string.ascii_letters + " ", max_size=5)
valid_texts = st.text(min_size=1, max_size=MAX_CHARS).filter(lambda text: text.strip() != "")
whitespace = st.sampled_from(["", " ", "\t\n", "\u3000", "\xa0 "])
bad_bytes = st.sampled_from([b"\xff\xfe", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80"])
bad_json = st.sampled_from(
    [b"", b"{", b'{"text": "x"', b"[" * 2000, b"{text: 1}", b'{"text": "a",}']
)


@st.composite
def items(draw: st.DrawFn) -> tuple[str, Any, str | None]:
    """(kind, fields-and-content-type, expected text or None) for one random request."""
    kind = draw(
        st.sampled_from(["valid-raw", "valid-json", "empty", "too-large", "bad-bytes", "bad-json"])
    )
    if kind == "valid-raw":
        text = draw(valid_texts)
        return kind, ({"body": text.encode()}, draw(st.sampled_from(["text/plain", None]))), text
    if kind == "valid-json":
        text = draw(valid_texts)
        return kind, ({"body": json.dumps({"text": text}).encode()}, "application/json"), text
    if kind == "empty":
        text = draw(whitespace)
        return kind, ({"body": json.dumps({"text": text}).encode()}, "application/json"), None
    if kind == "too-large":
        text = draw(st.text(alphabet="ab", min_size=MAX_CHARS + 1, max_size=MAX_CHARS + 5))
        return kind, ({"body": text.encode()}, "text/plain"), None
    if kind == "bad-bytes":
        body = draw(ascii_text).encode() + draw(bad_bytes) + draw(ascii_text).encode()
        return (
            kind,
            ({"body": body}, draw(st.sampled_from(["text/plain", "application/json"]))),
            None,
        )
    return kind, ({"body": draw(bad_json)}, "application/json"), None


EXPECTED = {
    "empty": (400, ErrorCode.EMPTY_TEXT),
    "too-large": (413, ErrorCode.PAYLOAD_TOO_LARGE),
    "bad-bytes": (400, ErrorCode.INVALID_ENCODING),
    "bad-json": (400, ErrorCode.INVALID_JSON),
}


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(items(), max_size=24))
def test_property_responses_match_requests_one_to_one(
    batch: list[tuple[str, Any, str | None]],
) -> None:
    """For any mix of items, each request gets exactly its own answer, never a neighbour's."""
    requests = [
        IncomingRequest(fields, content_type, f"req-{i}")
        for i, (_, (fields, content_type), _) in enumerate(batch)
    ]
    classifier = FakeClassifier()
    responses = answer_batch(requests, classifier, SETTINGS)[0]

    assert len(responses) == len(requests)
    valid = [text for _, _, text in batch if text is not None]
    assert classifier.calls == ([valid] if valid else [])
    for i, (response, (kind, _, text)) in enumerate(zip(responses, batch, strict=True)):
        if text is not None:
            assert_success(response, f"req-{i}", text)
        else:
            status, code = EXPECTED[kind]
            assert_error(response, f"req-{i}", status, code)


@dataclass(frozen=True)
class Lines:
    items: tuple[ValidText | Rejected, ...]


class LinesProtocol:
    """A toy protocol: a text/x-lines body is one text per line, answered as labels, one a line."""

    def decode(self, request: IncomingRequest, settings: HandlerSettings) -> Lines | None:
        if request.content_type != "text/x-lines":
            return None
        lines = request.fields["body"].decode().splitlines()
        return Lines(tuple(validate_text(line, settings.max_chars) for line in lines))

    def render(self, decoded: Lines, outcomes: tuple[Any, ...], request_id: str) -> Response:
        labels = [o.label if isinstance(o, Prediction) else o.code.value for o in outcomes]
        return Response(200, "OK", "\n".join(labels))

    def refuse(self, rejected: Rejected, request_id: str) -> Response:
        return Response(400, "Bad Request", rejected.code.value)


def test_a_new_protocol_is_one_object_in_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A protocol added to PROTOCOLS decodes and answers its own requests; its texts share the
    batch's one classifier call with the others', and the pipeline needs no change for it."""
    monkeypatch.setattr(pipeline, "PROTOCOLS", (LinesProtocol(), *pipeline.PROTOCOLS))
    classifier = FakeClassifier()
    requests = [
        IncomingRequest({"body": b"ab\n\nabc"}, "text/x-lines", "lines"),
        json_request({"text": "abcd"}, "plain"),
    ]
    lines, plain = answer_batch(requests, classifier, SETTINGS)[0]
    assert classifier.calls == [["ab", "abc", "abcd"]]
    assert lines.body == f"{fake_label('ab')}\nempty_text\n{fake_label('abc')}"
    assert body_of(plain)["label"] == fake_label("abcd")


@pytest.mark.parametrize(
    "broken",
    [
        Prediction(
            label="positive",
            score=float("nan"),
            scores={"positive": float("nan"), "negative": float("nan")},
            truncated=False,
        ),
        Prediction(
            label="positive",
            score=1.0,
            scores={"positive": 1.0, "negative": 0.0},
            truncated=False,
            raw_scores={"positive": float("inf"), "negative": 0.0},
        ),
    ],
)
def test_a_text_whose_scores_are_not_finite_fails_alone(broken: Prediction) -> None:
    """bf16 or fp16 can give a text NaN or infinite scores: that text answers 500 in valid JSON,
    its batch-mates their predictions (json.dumps would otherwise write NaN, which is not JSON)."""

    def classifier(texts: Sequence[str], *_: Any) -> tuple[list[Prediction], BatchStats]:
        predictions = [broken if text == "overflow" else fake_prediction(text) for text in texts]
        return predictions, BatchStats(texts=len(texts))

    requests = [
        raw_request(b"a fine film", "r0"),
        raw_request(b"overflow", "r1"),
        json_request({"text": "dull"}, "r2"),
    ]
    responses, _ = answer_batch(requests, classifier, SETTINGS)
    for response in responses:
        assert isinstance(response.body, str)
        json.loads(response.body, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert_success(responses[0], "r0", "a fine film")
    assert_error(responses[1], "r1", 500, ErrorCode.INTERNAL_ERROR)
    assert "NaN or infinity" in body_of(responses[1])["error"]["message"]
    assert_success(responses[2], "r2", "dull")


LABEL_NAMES = ["a", "b", "c", "d", "e", "f"]
SATURATED = [17.0, 18.0, 20.0, 88.0, 1e4, -17.0, -88.0, -1e4]
logit = st.one_of(st.floats(-1e4, 1e4, width=32), st.sampled_from(SATURATED))


@st.composite
def headed_items(draw: st.DrawFn) -> tuple[ScoreFunction, float | None, list[list[float]]]:
    """A head (its score function, multi-label or not, labels) and the logits of a few texts."""
    function = draw(st.sampled_from(list(ScoreFunction)))
    labels = draw(st.integers(1, len(LABEL_NAMES)))
    threshold = draw(st.one_of(st.none(), st.floats(0.0, 1.0)))
    rows = draw(st.lists(st.lists(logit, min_size=labels, max_size=labels), min_size=1, max_size=4))
    return function, threshold, rows


@settings(max_examples=1000, deadline=None)
@given(
    head=headed_items(),
    options=st.lists(
        st.fixed_dictionaries(
            {},
            optional={"top_k": st.integers(1, len(LABEL_NAMES) + 2), "raw_scores": st.booleans()},
        ),
        min_size=4,
        max_size=4,
    ),
)
def test_no_head_logits_or_options_fail_an_item_or_its_neighbour(
    head: tuple[ScoreFunction, float | None, list[list[float]]], options: list[dict[str, Any]]
) -> None:
    """Random heads, logits (saturated included) and options through the real scoring: every
    text answers 200 with its label among its scores, and a plain neighbour too."""
    function, threshold, rows = head
    labels = LABEL_NAMES[: len(rows[0])]

    def classifier(texts: Sequence[Any], *_: Any) -> tuple[list[Prediction], BatchStats]:
        logits = [rows[int(text.split()[-1])] if text != "plain" else rows[0] for text in texts]
        scores = apply_score_function(function, torch.tensor(logits, dtype=torch.float32))
        return [
            to_prediction(row, labels, False, raw, threshold)
            for row, raw in zip(scores.tolist(), logits, strict=True)
        ], BatchStats(texts=len(texts))

    requests = [
        json_request({"text": f"text {i}", **options[i]}, f"r{i}") for i in range(len(rows))
    ]
    responses = answer_batch(
        [*requests, json_request({"text": "plain"}, "plain")], classifier, SETTINGS
    )[0]
    for response in responses:
        assert response.status == 200, response.body
        body = body_of(response)
        assert body["score"] == body["scores"][body["label"]]


def test_a_saturated_multi_label_tie_keeps_the_label_in_its_top_k() -> None:
    """Two logits over about 17 both round to a sigmoid of 1.0 in float32: the label is the
    larger logit's, and top_k 1 with raw_scores keeps it (a KeyError failed the batch)."""
    logits = [18.0, 20.0]
    scores = torch.sigmoid(torch.tensor(logits)).tolist()
    assert scores[0] == scores[1] == 1.0
    prediction = to_prediction(scores, ["a", "b"], False, logits, 0.5)
    assert prediction.label == "b" and prediction.labels == ["b", "a"]
    cut = with_options(prediction, ScoreOptions(top_k=1, raw_scores=True))
    assert (cut.label, cut.score, cut.scores) == ("b", 20.0, {"b": 20.0})
