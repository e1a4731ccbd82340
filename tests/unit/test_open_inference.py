"""The Open Inference Protocol (KServe v2) request: decoding, answers, and its place in the batch."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handler.open_inference import InferRequest, decode_infer, decode_infer_document
from handler.pipeline import answer_batch
from handler.protocol import route_content_type
from handler.settings import HandlerSettings
from handler.values import ErrorCode, IncomingRequest, Rejected, ValidText
from tests.unit.test_pipeline import FakeClassifier, fake_prediction
from tests.worker_harness import Sent, predict

MAX_CHARS = 30
KSERVE_ROUTE = {"explain": "False"}
PREDICTIONS_ROUTE = {"explain": "False", "url_path": ""}


def text_tensor(data: Any, shape: list[int] | None = None, name: str = "text") -> dict[str, Any]:
    return {"name": name, "datatype": "BYTES", "shape": shape or [len(data)], "data": data}


def infer_body(*texts: str, **extra: Any) -> dict[str, Any]:
    return {"inputs": [text_tensor(list(texts))], **extra}


def decode(document: dict[str, Any], max_texts: int = 8) -> InferRequest | Rejected:
    return decode_infer_document(document, "bert", MAX_CHARS, max_texts)


def test_a_bytes_tensor_of_n_texts_becomes_n_valid_texts() -> None:
    decoded = decode(infer_body("good", "bad", id="req-1"))
    assert isinstance(decoded, InferRequest)
    assert decoded.items == (ValidText("good"), ValidText("bad"))
    assert (decoded.infer_id, decoded.model_name) == ("req-1", "bert")


@pytest.mark.parametrize("data", [["a", "b", "c"], [["a"], ["b"], ["c"]]])
def test_shape_n_by_1_takes_flat_or_nested_data(data: list[Any]) -> None:
    decoded = decode({"inputs": [text_tensor(data, [3, 1])]})
    assert isinstance(decoded, InferRequest)
    assert [item.text for item in decoded.items if isinstance(item, ValidText)] == ["a", "b", "c"]


def test_requested_outputs_are_kept_in_their_order() -> None:
    decoded = decode(infer_body("x", outputs=[{"name": "scores"}, {"name": "label"}]))
    assert isinstance(decoded, InferRequest) and decoded.outputs == ("scores", "label")


@pytest.mark.parametrize(
    ("document", "code", "words"),
    [
        ({"inputs": {"name": "text"}}, ErrorCode.INVALID_TYPE, '"inputs" must be an array'),
        ({"inputs": []}, ErrorCode.MISSING_FIELD, 'no "text" input'),
        (
            {"inputs": [text_tensor(["a"], name="prompt")]},
            ErrorCode.INVALID_TYPE,
            "unknown input 'prompt'",
        ),
        ({"inputs": [text_tensor(["a"]), text_tensor(["b"])]}, ErrorCode.INVALID_TYPE, "once"),
        (
            {"inputs": [{**text_tensor(["a"]), "datatype": "FP32"}]},
            ErrorCode.INVALID_TYPE,
            '"BYTES"',
        ),
        ({"inputs": [text_tensor(["a", "b"], [1, 2])]}, ErrorCode.INVALID_TYPE, "[n] or [n, 1]"),
        ({"inputs": [text_tensor(["a"], [1, 1, 1])]}, ErrorCode.INVALID_TYPE, "[n] or [n, 1]"),
        ({"inputs": [text_tensor(["a", "b"], [3])]}, ErrorCode.INVALID_TYPE, "3 elements"),
        ({"inputs": [text_tensor([["a", "b"]], [2])]}, ErrorCode.INVALID_TYPE, "2 elements"),
        ({"inputs": [text_tensor("ab", [2])]}, ErrorCode.INVALID_TYPE, "2 elements"),
        ({"inputs": [text_tensor([], [0])]}, ErrorCode.EMPTY_TEXT, "no texts"),
        (
            {"inputs": [text_tensor(["a"] * 9)]},
            ErrorCode.PAYLOAD_TOO_LARGE,
            "9 texts; the limit is 8",
        ),
        (
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}]},
            ErrorCode.MISSING_FIELD,
            'no "data"',
        ),
        (
            {
                "inputs": [
                    {
                        "name": "text",
                        "datatype": "BYTES",
                        "shape": [1],
                        "parameters": {"binary_data_size": 9},
                    }
                ]
            },
            ErrorCode.INVALID_TYPE,
            "binary tensor data",
        ),
        (infer_body("a", id=7), ErrorCode.INVALID_TYPE, '"id" must be a string'),
        (
            infer_body("a", outputs=[{"name": "logits"}]),
            ErrorCode.INVALID_TYPE,
            "unknown output 'logits'",
        ),
        (infer_body("a", parameters=[1]), ErrorCode.INVALID_TYPE, '"parameters" must be an object'),
    ],
)
def test_a_malformed_request_is_rejected_as_a_whole(
    document: dict[str, Any], code: ErrorCode, words: str
) -> None:
    decoded = decode(document)
    assert isinstance(decoded, Rejected)
    assert decoded.code == code and words in decoded.message


@pytest.mark.parametrize(
    ("texts", "code", "place"),
    [
        (["fine", "   "], ErrorCode.EMPTY_TEXT, "text[1]"),
        (["fine", "ok", "x" * 31], ErrorCode.PAYLOAD_TOO_LARGE, "text[2]"),
        (["fine", 5], ErrorCode.INVALID_TYPE, "text[1]"),
        (["\ud800"], ErrorCode.INVALID_ENCODING, "text[0]"),
    ],
)
def test_a_bad_text_rejects_its_request_naming_its_index(
    texts: list[Any], code: ErrorCode, place: str
) -> None:
    decoded = decode({"inputs": [text_tensor(texts)]})
    assert isinstance(decoded, Rejected)
    assert decoded.code == code and decoded.message.startswith(place)


def test_text_pair_must_match_the_text_tensor() -> None:
    document = {"inputs": [text_tensor(["a", "b"]), text_tensor(["c"], name="text_pair")]}
    decoded = decode(document)
    assert isinstance(decoded, Rejected) and "must match" in decoded.message
    bad_pair = decode({"inputs": [text_tensor(["a"]), text_tensor([" "], name="text_pair")]})
    assert isinstance(bad_pair, Rejected) and bad_pair.message.startswith("text_pair[0]")


def wire(
    document: Any,
    content_type: str | None = "application/json",
    headers: dict[str, str] | None = None,
):
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    request = IncomingRequest({"body": body}, content_type, "r", headers or {}, "bert")
    return decode_infer(request, HandlerSettings(max_chars=MAX_CHARS, max_texts_per_request=8))


def test_only_json_objects_with_inputs_are_v2_requests() -> None:
    assert isinstance(wire(infer_body("a")), InferRequest)
    assert wire({"text": 'mentions "inputs" in passing'}) is None
    assert wire({"instances": ["a"]}) is None
    assert wire(b'{"inputs": [') is None  # not JSON: the usual decoding answers invalid_json
    assert (
        wire(infer_body("a"), "text/plain") is None
    )  # a text that looks like JSON, on /predictions


def test_binary_tensor_data_gets_a_clear_400() -> None:
    body = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}).encode()
    rejected = wire(
        body + b"\x03\x00\x00\x00abc",
        None,
        {**KSERVE_ROUTE, "Inference-Header-Content-Length": str(len(body))},
    )
    assert isinstance(rejected, Rejected)
    assert rejected.code == ErrorCode.INVALID_TYPE and "binary tensor data" in rejected.message


def test_kserve_routes_take_json_only() -> None:
    """tritonclient sends no Content-Type: on KServe's routes that means JSON; any other type is a 400."""
    assert route_content_type(KSERVE_ROUTE, None) == "application/json"
    assert route_content_type(PREDICTIONS_ROUTE, None) is None
    assert (
        route_content_type(KSERVE_ROUTE, "application/json; charset=utf-8")
        == "application/json; charset=utf-8"
    )
    rejected = wire(infer_body("a"), "application/octet-stream", KSERVE_ROUTE)
    assert isinstance(rejected, Rejected) and "JSON" in rejected.message
    assert wire(infer_body("a"), "text/plain", PREDICTIONS_ROUTE) is None


def request(document: Any, index: int) -> IncomingRequest:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return IncomingRequest(
        {"body": body}, route_content_type(KSERVE_ROUTE, None), f"ts-{index}", KSERVE_ROUTE, "bert"
    )


def test_v2_texts_share_the_batchs_one_classifier_call() -> None:
    """v2 texts join the single and list texts of the same TorchServe batch in one call; a bad
    v2 request fails alone, in the protocol's error shape; the others are answered."""
    classifier = FakeClassifier()
    requests = [
        request(infer_body("first", "second", id="mine"), 0),
        IncomingRequest({"body": b"plain text"}, "text/plain", "ts-1"),
        request(infer_body("fine", ""), 2),
        request({"texts": ["listed"]}, 3),
        request(infer_body("third"), 4),
    ]
    responses = answer_batch(requests, classifier, HandlerSettings(max_chars=MAX_CHARS))[0]
    assert classifier.calls == [["first", "second", "plain text", "listed", "third"]]
    assert [r.status for r in responses] == [200, 200, 400, 200, 200]
    first = json.loads(responses[0].body)
    assert (first["model_name"], first["id"]) == ("bert", "mine")
    outputs = {output["name"]: output for output in first["outputs"]}
    assert outputs["label"] == {
        "name": "label",
        "datatype": "BYTES",
        "shape": [2],
        "data": [fake_prediction("first").label, fake_prediction("second").label],
    }
    labels = json.loads(outputs["scores"]["parameters"]["labels"])
    assert (
        outputs["scores"]["shape"] == [2, len(labels)] and outputs["scores"]["datatype"] == "FP32"
    )
    expected = [fake_prediction(t).scores[label] for t in ("first", "second") for label in labels]
    assert outputs["scores"]["data"] == pytest.approx(expected)
    assert outputs["truncated"] == {
        "name": "truncated",
        "datatype": "BOOL",
        "shape": [2],
        "data": [False, False],
    }
    assert json.loads(responses[2].body) == {
        "error": "empty_text: text[1]: text is empty or only white space"
    }
    assert json.loads(responses[4].body)["id"] == "ts-4"


def test_a_model_failure_answers_every_v2_request_500_in_the_v2_shape() -> None:
    responses = answer_batch(
        [request(infer_body("a"), 0)],
        FakeClassifier(error=RuntimeError("boom")),
        HandlerSettings(max_chars=MAX_CHARS),
    )[0]
    assert responses[0].status == 500
    assert json.loads(responses[0].body)["error"].startswith("internal_error: ")


@pytest.fixture(scope="module")
def service(tiny_worker):
    return tiny_worker()


def test_through_torchserves_worker_code_v2_scores_equal_plain_requests(service) -> None:
    """In ts.service.Service, with the KServe route's headers and no Content-Type (as tritonclient
    sends), a v2 request answers the same scores as the same texts sent as plain requests."""
    texts = ["a fine film", "dull and far too long for its own good", "ok"]
    v2 = Sent(
        json.dumps(infer_body(*texts, outputs=[{"name": "scores"}])).encode(),
        None,
        (("explain", "False"),),
    )
    answers = predict(service.service, [v2, *(Sent(t.encode()) for t in texts)])
    assert [a.status for a in answers] == [200] * 4
    (scores,) = json.loads(answers[0].body)["outputs"]
    labels = json.loads(scores["parameters"]["labels"])
    plain = [json.loads(a.body)["scores"][label] for a in answers[1:] for label in labels]
    assert scores["data"] == pytest.approx(plain, abs=1e-6)


def test_through_torchserves_worker_code_v2_pairs_equal_plain_pair_requests(service) -> None:
    """A v2 request with a text_pair tensor answers what the same pairs answer as JSON pairs."""
    pairs = [
        ("It rains.", "The street is wet."),
        ("ok", "a much longer second text than the first"),
    ]
    v2_body = {
        "inputs": [
            text_tensor([text for text, _ in pairs]),
            text_tensor([pair for _, pair in pairs], name="text_pair"),
        ],
        "outputs": [{"name": "scores"}],
    }
    v2 = Sent(json.dumps(v2_body).encode(), None, (("explain", "False"),))
    plain = [
        Sent(json.dumps({"text": text, "text_pair": pair}).encode(), "application/json")
        for text, pair in pairs
    ]
    answers = predict(service.service, [v2, *plain])
    assert [a.status for a in answers] == [200] * 3
    (scores,) = json.loads(answers[0].body)["outputs"]
    labels = json.loads(scores["parameters"]["labels"])
    expected = [json.loads(a.body)["scores"][label] for a in answers[1:] for label in labels]
    assert scores["data"] == pytest.approx(expected, abs=1e-6)
