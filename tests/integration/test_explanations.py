"""Explanations through a real TorchServe: /explanations/bert and KServe v1's :explain, the
client and the command, and predictions beside explanations answered as if alone."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from bert_serve import Client
from tests.unit.test_explain import cosine, reference, top3

BERT_SERVE = Path(sys.executable).parent / "bert-serve"


def explain_url(predict_url: str) -> str:
    """``.../predictions/bert`` -> ``.../explanations/bert``."""
    head, _, model = predict_url.rpartition("/predictions/")
    return f"{head}/explanations/{model}"


TEXT = "A wonderful, moving film with a great cast; I loved every minute."


@pytest.fixture(scope="module")
def headers(server) -> dict[str, str]:
    return server.headers()


def test_explanations_route_answers_captums_importances(server, headers, real_model_dir) -> None:
    answer = requests.post(
        explain_url(server.predict_url),
        data=TEXT.encode(),
        headers=headers | {"Content-Type": "text/plain"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    words, expected, target = reference(real_model_dir, TEXT, 50)
    assert body["words"] == words and body["label"] == "positive" and target == 1
    assert cosine(body["importances"], expected) >= 0.999
    assert top3(body["importances"]) == top3(expected)
    assert set(body) >= {"delta", "score", "truncated", "n_steps", "request_id"}


def test_kserve_v1_explain_answers_each_instance(server, headers) -> None:
    answer = requests.post(
        f"{server.inference_url}/v1/models/bert:explain",
        json={
            "instances": ["great film", "  ", {"text": "dull", "text_pair": "so dull"}],
            "n_steps": 8,
        },
        headers=headers,
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    first, empty, pair = answer.json()["explanations"]
    assert first["words"] == ["[CLS]", "great", "film", "[SEP]"] and first["n_steps"] == 8
    assert empty["error"]["code"] == "empty_text"
    assert pair["words"].count("[SEP]") == 2


def test_bad_options_and_v2_bodies_get_their_own_codes(server, headers) -> None:
    url = explain_url(server.predict_url)
    cases = [
        ({"text": "fine", "n_steps": 500}, 400, "invalid_option"),
        ({"text": "fine", "target": "neither"}, 400, "invalid_option"),
    ]
    for body, status, code in cases:
        answer = requests.post(url, json=body, headers=headers, timeout=120)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code)
    v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["fine"]}]}
    answer = requests.post(
        f"{server.inference_url}/v2/models/bert/explain", json=v2, headers=headers, timeout=120
    )
    assert answer.status_code == 400 and answer.json()["error"].startswith("not_explainable")


def test_predictions_beside_explanations_answer_as_alone(server, headers) -> None:
    """Predictions and explanations sent at once (so TorchServe batches them together) each
    equal the same request sent alone."""
    url = explain_url(server.predict_url)
    texts = [f"review number {i}: {'great' if i % 2 else 'dull'} film" for i in range(8)]

    def send(i: int) -> dict:
        target = url if i % 2 else server.predict_url
        body = {"text": texts[i], "n_steps": 10} if i % 2 else {"text": texts[i]}
        answer = requests.post(target, json=body, headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        return {k: v for k, v in answer.json().items() if k != "request_id"}

    alone = [send(i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(send, range(8)))
    for a, b in zip(alone, together, strict=True):
        assert a.keys() == b.keys() and a["label"] == b["label"]
        if "importances" in a:
            assert a["words"] == b["words"]
            assert a["importances"] == pytest.approx(b["importances"], abs=1e-5)
        else:
            assert a["scores"] == pytest.approx(b["scores"], abs=1e-5)


def test_client_and_command_explain(server) -> None:
    token = server.key("inference")
    explanation = Client(server.inference_url, token=token).explain(
        TEXT, target="negative", n_steps=10
    )
    assert explanation.label == "negative" and len(explanation.words) == len(
        explanation.importances
    )
    command = [str(BERT_SERVE), "explain", "great film", "--url", server.inference_url]
    command += ["--token", token] if token else []
    printed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert lines[0].startswith("positive") and "\033[" not in printed.stdout
    assert [line.split()[0] for line in lines[1:]] == ["[CLS]", "great", "film", "[SEP]"]
    assert "\u2588" in printed.stdout
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(as_json.stdout)["words"] == ["[CLS]", "great", "film", "[SEP]"]
