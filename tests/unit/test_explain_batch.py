"""Explanation requests in TorchServe batches: read per request from the ``explain`` header,
answered each as if alone, with their own errors (through TorchServe's worker code)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from handler.native import decode_request
from handler.precision import cpu_has_native_bf16
from handler.protocol import is_explanation
from handler.values import ErrorCode, ExplainOptions, IncomingRequest, Rejected, ValidText
from tests.conftest import ROOT
from tests.worker_harness import Sent, predict

JSON = "application/json"
# What TorchServe 0.12's frontend adds (InferenceRequestHandler): url_path on /predictions and
# /explanations, explain False on every inference route and then True on the explanation ones.
PREDICTIONS = (("url_path", ""), ("explain", "False"))
EXPLANATIONS = (("url_path", ""), ("explain", "True"))
KSERVE_EXPLAIN = (("explain", "True"),)


def test_the_header_is_read_exactly_as_torchserve_sets_it() -> None:
    assert is_explanation({"explain": "True"})
    assert not is_explanation({"explain": "False"})
    assert not is_explanation({"Explain": "True", "explain": "False"})
    assert not is_explanation({})


def test_explanation_options_ride_on_each_valid_text() -> None:
    body = (
        b'{"texts": ["a", "", {"text": "b", "text_pair": "c"}], "target": "positive", "n_steps": 5}'
    )
    decoded = decode_request({"body": body}, JSON, 100, 8, explaining=True)
    assert not isinstance(decoded, Rejected)
    first, empty, pair = decoded.items
    options = ExplainOptions(target="positive", n_steps=5)
    assert first == ValidText("a", explain=options)
    assert isinstance(empty, Rejected) and empty.code == ErrorCode.EMPTY_TEXT
    assert pair == ValidText("b", "c", explain=options)
    plain = decode_request({"body": b"just text"}, "text/plain", 100, 8, explaining=True)
    assert plain == ValidText("just text", explain=ExplainOptions())
    predicted = decode_request({"body": body}, JSON, 100, 8)
    assert not isinstance(predicted, Rejected) and predicted.items[0] == ValidText("a")


@pytest.mark.parametrize(
    "document",
    [{"text": "a", "n_steps": 0}, {"text": "a", "n_steps": 2.5}, {"text": "a", "target": [1]}],
)
def test_bad_explanation_options_refuse_the_request(document: dict[str, Any]) -> None:
    decoded = decode_request({"body": json.dumps(document).encode()}, JSON, 100, 8, True)
    assert isinstance(decoded, Rejected) and decoded.code == ErrorCode.INVALID_OPTION


def without_ids(body: Any) -> Any:
    """The answer with its request id left out (TorchServe's ids differ between batches)."""
    if isinstance(body, dict):
        return {k: without_ids(v) for k, v in body.items() if k != "request_id"}
    if isinstance(body, list):
        return [without_ids(v) for v in body]
    return body


def same(a: Any, b: Any, tolerance: float = 1e-6) -> bool:
    """Equal, floats within ``tolerance`` (a prediction's padding beside longer batch-mates
    moves its scores by about 1e-7)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], tolerance) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and abs(a - b) <= tolerance
    return type(a) is type(b) and a == b


MIXED = [
    Sent(b"A wonderful, moving film.", "text/plain", EXPLANATIONS),
    Sent(b'{"text": "dull and far too long"}', JSON, PREDICTIONS),
    Sent(
        b'{"text": "dull and far too long", "target": "negative", "n_steps": 20}',
        JSON,
        EXPLANATIONS,
    ),
    Sent(b'{"texts": ["great", " ", {"text": "it was", "text_pair": "fine"}]}', JSON, EXPLANATIONS),
    Sent(b'{"texts": ["great", "awful acting"], "top_k": 1}', JSON, PREDICTIONS),
    Sent(b'{"instances": ["loved it", "hated it"]}', None, KSERVE_EXPLAIN),
    Sent(b'{"text": "bad option", "n_steps": 1000}', JSON, EXPLANATIONS),
    Sent(b'{"text": "a pair", "text_pair": "of texts"}', JSON, PREDICTIONS),
]


def test_a_mixed_batch_answers_each_request_as_if_alone(tiny_worker) -> None:
    """Eight requests, explanations and predictions of every shape and one bad option: each
    answer (status, body) equals the same request's answer in a batch of its own."""
    service = tiny_worker(explain_steps=50).service
    together = predict(service, MIXED)
    alone = [predict(service, [sent])[0] for sent in MIXED]
    for index, (mixed, single) in enumerate(zip(together, alone, strict=True)):
        assert mixed.status == single.status, index
        assert same(without_ids(json.loads(mixed.body)), without_ids(json.loads(single.body))), (
            index,
            mixed.body,
            single.body,
        )
    statuses = [answer.status for answer in together]
    assert statuses == [200, 200, 200, 200, 200, 200, 400, 200]
    bodies = [json.loads(answer.body) for answer in together]
    assert set(bodies[0]) >= {"words", "importances", "delta", "label", "score"}
    assert "importances" not in bodies[1] and "scores" in bodies[1]
    assert bodies[2]["label"] == "negative" and bodies[2]["n_steps"] == 20
    listed = bodies[3]["results"]
    assert "words" in listed[0] and listed[1]["error"]["code"] == "empty_text"
    assert listed[2]["words"].count("[SEP]") == 2
    assert [len(entry["words"]) for entry in bodies[5]["explanations"]] == [4, 4]
    assert bodies[6]["error"]["code"] == "invalid_option"


def test_kserve_v2_explain_is_refused_with_its_own_code(tiny_worker) -> None:
    v2 = b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}'
    (answer,) = predict(tiny_worker().service, [Sent(v2, None, KSERVE_EXPLAIN)])
    assert answer.status == 400
    assert json.loads(answer.body)["error"].startswith("not_explainable")


def test_a_client_explain_header_on_predictions_still_predicts(tiny_worker) -> None:
    """The frontend's ``explain: False`` comes after the client's own and wins."""
    sent = Sent(b"some text", "text/plain", (("explain", "True"), *PREDICTIONS))
    (answer,) = predict(tiny_worker().service, [sent])
    assert answer.status == 200 and "scores" in json.loads(answer.body)


def test_a_failing_explanation_fails_only_its_text(tiny_worker, monkeypatch) -> None:
    import handler.explain

    original = handler.explain.explain

    def broken(loaded: Any, text: Any, *rest: Any) -> Any:
        if text == "boom":
            raise RuntimeError("out of memory")
        return original(loaded, text, *rest)

    monkeypatch.setattr(handler.explain, "explain", broken)
    answers = predict(
        tiny_worker().service,
        [
            Sent(b'{"texts": ["boom", "fine"]}', JSON, EXPLANATIONS),
            Sent(b"predicted", "text/plain", PREDICTIONS),
        ],
    )
    results = json.loads(answers[0].body)["results"]
    assert results[0]["error"]["code"] == "internal_error" and "words" in results[1]
    assert answers[1].status == 200


def test_requests_carry_the_header_per_item() -> None:
    request = IncomingRequest({"body": b"x"}, "text/plain", "r", dict(EXPLANATIONS))
    assert is_explanation(request.headers)


def strict_json(body: bytes) -> Any:
    """Parse as JSON is: Python's json module would otherwise accept NaN and Infinity."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


def test_a_non_finite_explanation_fails_only_its_text(tiny_worker, monkeypatch) -> None:
    """The first text explained comes out NaN (as bf16 or fp16 can make it): that text answers
    its own 500 in valid JSON; the other explanations and the prediction are answered."""
    import handler.explain

    worker = tiny_worker()
    # the budget's timing explanation (a worker's first) runs before the patch
    worker.handler.explain_budget.calibrate(worker.handler.loaded, worker.handler.settings)
    service = worker.service
    original = handler.explain.summarize
    calls = []

    def nan_first(attributions: Any) -> list[float]:
        calls.append(1)
        values = original(attributions)
        return [math.nan] * len(values) if len(calls) == 1 else values

    monkeypatch.setattr(handler.explain, "summarize", nan_first)
    answers = predict(
        service,
        [
            Sent(b'{"texts": ["first", "second"]}', JSON, EXPLANATIONS),
            Sent(b"predicted", "text/plain", PREDICTIONS),
            Sent(b"third", "text/plain", EXPLANATIONS),
        ],
    )
    assert [answer.status for answer in answers] == [200, 200, 200]
    first, second = strict_json(answers[0].body)["results"]
    assert first["error"]["code"] == "internal_error"
    assert "NaN or infinity" in first["error"]["message"]
    assert "words" in second and all(math.isfinite(v) for v in second["importances"])
    assert "scores" in strict_json(answers[1].body)
    assert "importances" in strict_json(answers[2].body)


def test_a_lone_non_finite_explanation_answers_500_in_json(tiny_worker, monkeypatch) -> None:
    import handler.explain

    service = tiny_worker().service
    monkeypatch.setattr(handler.explain, "summarize", lambda a: [math.inf] * a.shape[1])
    (answer,) = predict(service, [Sent(b"alone", "text/plain", EXPLANATIONS)])
    assert answer.status == 500
    assert strict_json(answer.body)["error"]["code"] == "internal_error"


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
def test_a_bf16_worker_answers_explanations_in_strict_json(tiny_worker) -> None:
    """A real bf16 worker (TorchServe's worker code, the tiny BERT's weights in bf16)."""
    service = tiny_worker(precision="bf16", device="cpu").service
    answers = predict(service, MIXED[:4])
    assert [answer.status for answer in answers] == [200, 200, 200, 200]
    bodies = [strict_json(answer.body) for answer in answers]
    assert len(bodies[0]["importances"]) == len(bodies[0]["words"])
    assert bodies[2]["label"] == "negative" and bodies[2]["n_steps"] == 20


def test_a_worker_starts_without_captum_and_explains_when_asked(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A worker's start neither imports Captum nor times an explanation (in a fresh process:
    this one has imported Captum already); its first explanation does both."""
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from tests.worker_harness import Sent, build_worker, predict
        worker = build_worker(Path({str(tmp_path)!r}), Path({str(tiny_model_dir)!r}))
        print("captum" in sys.modules, worker.handler.explain_budget.per_token_step)
        sent = Sent(b"fine", "text/plain", {EXPLANATIONS!r})
        (answer,) = predict(worker.service, [sent])
        print(answer.status, "captum" in sys.modules, worker.handler.explain_budget.per_token_step)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    started, explained = result.stdout.splitlines()[-2:]
    assert started == "False None"
    status, imported, pace = explained.split()
    assert (status, imported) == ("200", "True") and float(pace) > 0
