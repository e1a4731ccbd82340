"""List requests {"texts": [...]}: checked as a list, then per text, run with everything else."""

from __future__ import annotations

import json

import pytest

from handler.native import TextList, decode_request
from handler.pipeline import answer_batch
from handler.settings import HandlerSettings
from handler.values import BatchStats, ErrorCode, IncomingRequest, Prediction, Rejected, ValidText
from tests.worker_harness import Sent, predict

JSON = "application/json"


def decode(document: object, max_texts: int = 3) -> object:
    return decode_request({"body": json.dumps(document).encode()}, JSON, 20, max_texts)


def test_each_text_of_a_list_is_validated_on_its_own() -> None:
    """An empty string at position 2 is rejected alone; its neighbours stay valid."""
    result = decode({"texts": ["good", "", 5]})
    assert isinstance(result, TextList)
    assert result.items[0] == ValidText("good")
    assert isinstance(result.items[1], Rejected) and result.items[1].code is ErrorCode.EMPTY_TEXT
    assert isinstance(result.items[2], Rejected) and result.items[2].code is ErrorCode.INVALID_TYPE
    assert "texts[2]" in result.items[2].message


def test_kserve_instances_take_strings_or_text_objects() -> None:
    """KServe's v1 {"instances": [...]}: each item a string or {"text": ...}, checked alone."""
    result = decode({"instances": ["good", {"text": "fine", "id": 7}, {"txt": "x"}]})
    assert isinstance(result, TextList) and result.field == "instances"
    assert result.items[:2] == (ValidText("good"), ValidText("fine"))
    assert isinstance(result.items[2], Rejected) and result.items[2].code is ErrorCode.INVALID_TYPE
    assert "instances[2]" in result.items[2].message


def test_instances_are_answered_as_predictions() -> None:
    """The answer to {"instances": [...]} uses KServe's "predictions" key, in order."""

    def classifier(texts, *_):
        return [Prediction(t, 1.0, {t: 1.0}, False) for t in texts], BatchStats(texts=len(texts))

    request = IncomingRequest({"body": b'{"instances": ["one", "", {"text": "two"}]}'}, JSON, "r")
    (response,) = answer_batch([request], classifier, HandlerSettings(max_chars=100))[0]
    body = json.loads(response.body)
    assert response.status == 200 and set(body) == {"predictions", "request_id"}
    assert [entry.get("label") for entry in body["predictions"]] == ["one", None, "two"]
    assert body["predictions"][1]["error"]["code"] == "empty_text"


@pytest.mark.parametrize(
    ("document", "code"),
    [
        ({"texts": ["a", "b", "c", "d"]}, ErrorCode.PAYLOAD_TOO_LARGE),
        ({"texts": []}, ErrorCode.EMPTY_TEXT),
        ({"texts": "not a list"}, ErrorCode.INVALID_TYPE),
        ({"texts": ["a"], "text": "b"}, ErrorCode.INVALID_TYPE),
        ({"texts": ["a"], "instances": ["b"]}, ErrorCode.INVALID_TYPE),
        ({"instances": ["a", "b", "c", "d"]}, ErrorCode.PAYLOAD_TOO_LARGE),
        ({"instances": []}, ErrorCode.EMPTY_TEXT),
        ({"instances": {"text": "a"}}, ErrorCode.INVALID_TYPE),
    ],
)
def test_a_malformed_list_rejects_the_whole_request(document: object, code: ErrorCode) -> None:
    """Over the limit, empty, not an array, or mixed with "text": the request alone is refused."""
    result = decode(document)
    assert isinstance(result, Rejected) and result.code is code


def test_list_texts_share_the_classifier_call_with_single_requests() -> None:
    """One classifier call for the batch, in request order; results go back to their slots."""
    calls: list[list[str]] = []

    def classifier(texts, *_):
        calls.append(list(texts))
        return [Prediction(t, 1.0, {t: 1.0}, False) for t in texts], BatchStats(texts=len(texts))

    def request(body: object, rid: str) -> IncomingRequest:
        return IncomingRequest({"body": json.dumps(body).encode()}, JSON, rid)

    responses = answer_batch(
        [
            request({"text": "one"}, "a"),
            request({"texts": ["two", "", "three"]}, "b"),
            request({"text": ""}, "c"),
        ],
        classifier,
        HandlerSettings(max_chars=100),
    )[0]
    assert calls == [["one", "two", "three"]]
    assert [r.status for r in responses] == [200, 200, 400]
    listed = json.loads(responses[1].body)
    assert listed["request_id"] == "b"
    assert [entry.get("label") for entry in listed["results"]] == ["two", None, "three"]
    assert listed["results"][1] == {
        "error": {"code": "empty_text", "message": "text is empty or only white space"}
    }


def test_a_model_failure_marks_each_list_text_but_keeps_the_list_shape() -> None:
    def broken(texts):
        raise RuntimeError("boom")

    request = IncomingRequest({"body": b'{"texts": ["x", ""]}'}, JSON, "r")
    (response,) = answer_batch([request], broken, HandlerSettings(max_chars=100))[0]
    results = json.loads(response.body)["results"]
    assert response.status == 200
    assert [entry["error"]["code"] for entry in results] == ["internal_error", "empty_text"]


def test_list_scores_equal_single_scores_through_the_worker(tiny_worker) -> None:
    """Through TorchServe's worker code: a text inside a list scores as it does alone."""
    service = tiny_worker().service
    alone = [
        json.loads(a.body)["scores"]
        for a in predict(service, [Sent(b"first text"), Sent(b"second one here")])
    ]
    (answer,) = predict(service, [Sent(b'{"texts": ["first text", " ", "second one here"]}', JSON)])
    results = json.loads(answer.body)["results"]
    assert answer.status == 200
    assert results[0]["scores"] == pytest.approx(alone[0], abs=1e-4)
    assert results[1]["error"]["code"] == "empty_text"
    assert results[2]["scores"] == pytest.approx(alone[1], abs=1e-4)
