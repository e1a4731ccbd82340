"""The Open Inference Protocol (KServe v2) on the real server, spoken by tritonclient[http].

tritonclient is Triton's own client: it sends no Content-Type, and `infer` adds
`Inference-Header-Content-Length` to the headers dict it is given, so each call gets a fresh one.
TorchServe 0.12 serves only `POST /v2/models/{model}/infer` of the protocol: the health and
metadata routes answer 404, and a versioned infer path (`model_version=`) is not routed.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

POSITIVE = "An absolute delight from start to finish."
NEGATIVE = "A tedious, joyless mess."


@pytest.fixture(scope="module")
def client(server) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(
        server.inference_url.removeprefix("http://"), connection_timeout=60, network_timeout=60
    )


def text_input(
    texts: list[str], shape: list[int] | None = None, binary: bool = False
) -> triton.InferInput:
    shape = shape or [len(texts)]
    tensor = triton.InferInput("text", shape, "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(shape), binary_data=binary)
    return tensor


def json_outputs(*names: str) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name, binary_data=False) for name in names]


def test_tritonclient_classifies_a_tensor_of_texts(server, client) -> None:
    result = client.infer(
        "bert",
        [text_input([POSITIVE, NEGATIVE])],
        outputs=json_outputs("label", "scores", "truncated"),
        request_id="triton-1",
        headers=server.headers(),
    )
    assert list(result.as_numpy("label")) == ["positive", "negative"]
    scores = result.as_numpy("scores")
    assert scores.dtype == np.float32 and scores.shape == (2, 2)
    assert np.allclose(scores.sum(axis=1), 1.0, atol=1e-5)
    assert list(result.as_numpy("truncated")) == [False, False]
    response = result.get_response()
    assert (response["model_name"], response["id"]) == ("bert", "triton-1")


def test_shape_n_by_1_and_default_outputs(server, client) -> None:
    """With no outputs named, tritonclient asks for binary outputs; JSON ones are answered and
    it reads them all the same."""
    result = client.infer(
        "bert", [text_input([NEGATIVE, POSITIVE], [2, 1])], headers=server.headers()
    )
    assert list(result.as_numpy("label")) == ["negative", "positive"]
    assert result.get_response()["id"]  # the server's request id when the client sent none


def test_scores_equal_the_same_texts_sent_to_predictions(server, client, predict_url) -> None:
    texts = [POSITIVE, "The plot wanders but the acting is superb.", NEGATIVE]
    result = client.infer(
        "bert", [text_input(texts)], outputs=json_outputs("scores"), headers=server.headers()
    )
    labels = result.get_output("scores")["parameters"]["labels"]
    plain = [
        requests.post(
            predict_url, json={"text": text}, headers=server.headers(), timeout=60
        ).json()["scores"]
        for text in texts
    ]
    expected = [[answer[label] for label in json.loads(labels)] for answer in plain]
    assert np.allclose(result.as_numpy("scores"), expected, atol=1e-5)


def test_a_bad_text_rejects_its_request_with_the_index(server, client) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("bert", [text_input([POSITIVE, "   "])], headers=server.headers())
    assert caught.value.status() == "400"
    assert "text[1]" in caught.value.message() and "empty_text" in caught.value.message()


def test_binary_tensor_data_is_a_clear_400(server, client) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("bert", [text_input([POSITIVE], binary=True)], headers=server.headers())
    assert caught.value.status() == "400" and "binary tensor data" in caught.value.message()


def test_concurrent_v2_requests_are_each_answered_as_alone(server, predict_url) -> None:
    """v2 requests sent at once with plain requests of the same texts share TorchServe batches;
    each v2 answer holds its own texts' scores, in order, equal to the plain answers
    (TorchServe's own kservev2 envelope answers only the first request of a batch)."""
    groups = [
        [f"review {i}: {'great' if i % 2 else 'awful'} film, scene {j}" for j in range(i % 3 + 1)]
        for i in range(12)
    ]

    def plain(text: str) -> list[float]:
        body = requests.post(
            predict_url, json={"text": text}, headers=server.headers(), timeout=60
        ).json()
        return [body["scores"]["negative"], body["scores"]["positive"]]

    def v2(texts: list[str]) -> list[list[float]]:
        local = triton.InferenceServerClient(
            server.inference_url.removeprefix("http://"), network_timeout=60
        )
        result = local.infer(
            "bert", [text_input(texts)], outputs=json_outputs("scores"), headers=server.headers()
        )
        assert result.get_output("scores")["parameters"]["labels"] == '["negative", "positive"]'
        return result.as_numpy("scores").tolist()

    with ThreadPoolExecutor(max_workers=16) as pool:
        v2_answers = [pool.submit(v2, texts) for texts in groups]
        plain_answers = [[pool.submit(plain, text) for text in texts] for texts in groups]
        for v2_answer, plain_group in zip(v2_answers, plain_answers, strict=True):
            expected = [answer.result() for answer in plain_group]
            assert np.allclose(v2_answer.result(), expected, atol=1e-5)
