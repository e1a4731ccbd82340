"""docs/openapi.yaml: a valid OpenAPI 3 document, in step with the error table and the handler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

from handler.pipeline import answer_batch
from handler.settings import HandlerSettings
from handler.values import HTTP_STATUS, IncomingRequest
from tests.conftest import ROOT
from tests.unit.test_pipeline import FakeClassifier

DOCUMENT = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
OPERATIONS = [(path, method) for path, item in DOCUMENT["paths"].items() for method in item]


def deref(node: dict[str, Any]) -> dict[str, Any]:
    """Follow local `#/...` references until a node has none."""
    while "$ref" in node:
        target: Any = DOCUMENT
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def test_the_document_is_valid_openapi() -> None:
    validate(DOCUMENT)


def limits(node: Any, key: str) -> list[int]:
    """Every value of ``key`` (``maxLength``, ``maxItems``) anywhere in ``node``."""
    if isinstance(node, dict):
        found = [node[key]] if isinstance(node.get(key), int) else []
        return found + [n for value in node.values() for n in limits(value, key)]
    if isinstance(node, list):
        return [n for value in node for n in limits(value, key)]
    return []


def test_the_documented_limits_are_the_handlers_defaults() -> None:
    """Text lengths are ``max_chars``; list sizes ``max_texts_per_request``, but for the Open
    Inference ``inputs`` (a text and its pair) and ``shape`` ([n] or [n, 1]), of 2."""
    defaults = HandlerSettings()
    assert set(limits(DOCUMENT, "maxLength")) == {defaults.max_chars}
    assert sorted(set(limits(DOCUMENT, "maxItems"))) == [2, defaults.max_texts_per_request]


def documented_handler_codes() -> dict[str, set[int]]:
    """Every handler error code the document answers, with the statuses it answers it under."""
    codes: dict[str, set[int]] = {}
    for path, method in OPERATIONS:
        for status, response in DOCUMENT["paths"][path][method]["responses"].items():
            schema = deref(deref(response)["content"]["application/json"]["schema"])
            for option in schema.get("anyOf", [schema]):
                error = deref(option).get("properties", {}).get("error", {})
                for code in deref(error).get("properties", {}).get("code", {}).get("enum", []):
                    codes.setdefault(code, set()).add(int(status))
    return codes


def test_error_codes_and_statuses_match_the_error_table() -> None:
    """A code added to, dropped from or moved in handler/values.py, or in the document, fails here."""
    table = {code.value: {status} for code, (status, _) in HTTP_STATUS.items()}
    assert documented_handler_codes() == table


def test_every_operation_documents_the_statuses_torchserve_itself_answers() -> None:
    """400 (token), 413 (body size), 503 (queue full), 500 and 507 (worker died)."""
    for path, method in OPERATIONS:
        assert {"200", "400", "413", "500", "503", "507"} <= set(
            DOCUMENT["paths"][path][method]["responses"]
        )


def answers_schema(status: int) -> dict[str, Any]:
    (path, method) = OPERATIONS[0]
    response = deref(DOCUMENT["paths"][path][method]["responses"][str(status)])
    return {
        **response["content"]["application/json"]["schema"],
        "components": DOCUMENT["components"],
    }


def infer(*texts: str) -> bytes:
    return json.dumps(
        {
            "id": "v2",
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
            ],
        }
    ).encode()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"a fine film", "text/plain"),
        (b"", "text/plain"),
        (b"\xff", None),
        (b"x" * 31, "text/plain"),
        (b'{"text": "fine"}', "application/json"),
        (b'{"text": 3}', "application/json"),
        (b'{"nope": 1}', "application/json"),
        (b"{", "application/json"),
        (b'{"texts": ["a", "", 5, {"text": "b"}]}', "application/json"),
        (b'{"instances": ["a", "  "]}', "application/json"),
        (b'{"texts": []}', "application/json"),
        (b'{"text": "a", "text_pair": "b", "top_k": 1}', "application/json"),
        (b'{"texts": [{"text": "a", "text_pair": " "}], "top_k": 1}', "application/json"),
        (b'{"text": "a", "top_k": 0}', "application/json"),
        (b'{"text": "a", "windows": false}', "application/json"),
        (b'{"texts": ["a", "b"], "windows": true}', "application/json"),
        (b'{"text": "a", "windows": "yes"}', "application/json"),
        (infer("a", "b"), "application/json"),
        (infer("a", ""), "application/json"),
    ],
)
def test_the_handlers_answers_conform_to_the_document(
    body: bytes, content_type: str | None
) -> None:
    """Each answer of the pipeline validates against the document's schema for its status."""
    (response,) = answer_batch(
        [IncomingRequest({"body": body}, content_type, "r-1")],
        FakeClassifier(),
        HandlerSettings(max_chars=30),
    )[0]
    OAS30Validator(answers_schema(response.status)).validate(json.loads(response.body))


def test_a_model_failure_conforms_too() -> None:
    (response,) = answer_batch(
        [IncomingRequest({"body": b"fine"}, "text/plain", "r-1")],
        FakeClassifier(error=RuntimeError("x")),
        HandlerSettings(max_chars=30),
    )[0]
    assert response.status == 500
    OAS30Validator(answers_schema(500)).validate(json.loads(response.body))


@pytest.mark.parametrize("body", [b'{"text": "fine"}', b'{"texts": ["a", "b"]}', infer("a")])
def test_an_expired_request_conforms_too(body: bytes) -> None:
    """504 deadline_exceeded, in our shape and in the Open Inference one."""
    stamp = {"X-Request-Start": "t=1000", "X-Request-Timeout": "1", "explain": "False"}
    (response,) = answer_batch(
        [IncomingRequest({"body": body}, "application/json", "r-1", headers=stamp)],
        FakeClassifier(),
        HandlerSettings(),
    )[0]
    assert response.status == 504
    OAS30Validator(answers_schema(504)).validate(json.loads(response.body))


def test_windowed_answers_and_the_windows_refusal_conform(tiny_model_dir: Path) -> None:
    """A long text's answer with its `windows` (alone and in a list, beside a short one), and
    the 413 of a request past max_windows_per_request, by the real classifier (tiny model)."""
    from handler.inference import Windows, classify_admitted
    from handler.model import load_model

    settings = HandlerSettings(max_windows_per_request=8)
    model = load_model(tiny_model_dir, HandlerSettings(device="cpu"), None)

    def classifier(texts: Any, windowed: Any, admit: Any) -> Any:
        return classify_admitted(model, texts, 128, 4096, Windows(settings.stride), windowed, admit)

    long = "word " * 300
    bodies = [{"text": long}, {"texts": [long, "short"]}, {"texts": [long] * 4}]
    requests = [
        IncomingRequest({"body": json.dumps(b).encode()}, "application/json", f"r-{i}")
        for i, b in enumerate(bodies)
    ]
    responses, _ = answer_batch(requests, classifier, settings)
    answers = [json.loads(response.body) for response in responses]
    assert [response.status for response in responses] == [200, 200, 413]
    assert answers[0]["windows"] >= 2 and answers[1]["results"][0]["windows"] >= 2
    assert "windows" not in answers[1]["results"][1]
    for response, answer in zip(responses, answers, strict=True):
        OAS30Validator(answers_schema(response.status)).validate(answer)


def explain_schema(status: int, operation: str = "/explanations/bert") -> dict[str, Any]:
    response = deref(DOCUMENT["paths"][operation]["post"]["responses"][str(status)])
    return {
        **response["content"]["application/json"]["schema"],
        "components": DOCUMENT["components"],
    }


@pytest.mark.parametrize(
    ("body", "content_type", "route"),
    [
        (b"a fine film", "text/plain", "/explanations/bert"),
        (
            b'{"text": "fine", "target": "positive", "n_steps": 3}',
            "application/json",
            "/explanations/bert",
        ),
        (
            b'{"texts": ["a", "", {"text": "b", "text_pair": "c"}]}',
            "application/json",
            "/explanations/bert",
        ),
        (b'{"text": "fine", "n_steps": 0}', "application/json", "/explanations/bert"),
        (b'{"text": "fine", "n_steps": 51}', "application/json", "/explanations/bert"),
        (b'{"text": "fine", "target": "neither"}', "application/json", "/explanations/bert"),
        (b'{"text": "' + b"word " * 5 + b'"}', "application/json", "/explanations/bert"),
        (b'{"instances": ["a", " "]}', "application/json", "/v1/models/bert:explain"),
        (infer("a"), "application/json", "/v1/models/bert:explain"),
    ],
)
def test_explanations_conform_to_the_document(
    body: bytes, content_type: str | None, route: str, tiny_model_dir
) -> None:
    """Explanations by the real stage (tiny model), each answer valid for its status."""
    from handler.explain import explain_all
    from handler.model import load_model

    settings = HandlerSettings(max_chars=30, explain_max_tokens=6)
    model = load_model(tiny_model_dir, settings, None)
    headers = {"explain": "True"} if "v1" in route else {"explain": "True", "url_path": ""}
    (response,) = answer_batch(
        [IncomingRequest({"body": body}, content_type, "r-1", headers=headers)],
        FakeClassifier(),
        settings,
        explainer=lambda items: explain_all(model, items, settings),
    )[0]
    OAS30Validator(explain_schema(response.status, route)).validate(json.loads(response.body))
