"""The Python client and the `bert-serve` command against the real torchserve of the session."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from bert_serve_server.control import curl_example

import bert_serve.exceptions as client_errors
from bert_serve import BertServeError, Client
from lab.corpus import make_corpus

BERT_SERVE = Path(sys.executable).parent / "bert-serve"
# Positions (0-based) and contents of the bad lines mixed into the 500-line file.
BAD_LINES = {
    3: (b"", "empty_text"),
    77: (b"   \t ", "empty_text"),
    150: (b"caf\xe9 latin-1, not UTF-8", "invalid_encoding"),
    321: (b"long " * 2001, "payload_too_large"),
    499: (b"", "empty_text"),
}


@pytest.fixture(scope="module")
def client(server) -> Client:
    return Client(server.inference_url, token=server.key("inference"))


def test_classify_one_text(client: Client) -> None:
    assert client.classify("An absolute delight from start to finish.").label == "positive"
    assert client.classify("A tedious, joyless mess.").label == "negative"


def test_classify_raises_the_servers_code(client: Client) -> None:
    with pytest.raises(BertServeError) as caught:
        client.classify("  ")
    assert (caught.value.code, caught.value.status) == ("empty_text", 400)
    assert caught.value.request_id and caught.value.request_id.startswith("bert-serve-")


def test_a_wrong_token_is_a_typed_error(server) -> None:
    with pytest.raises(BertServeError) as caught:
        Client(server.inference_url, token="not-the-key").classify("fine")
    assert caught.value.code == "unauthorized"


def test_classify_many_mixed_valid_and_invalid_texts(client: Client) -> None:
    """Bad texts fail alone, in place; good texts score as they do when sent one by one."""
    texts = make_corpus(size=120, seed=3)
    bad = {
        5: ("", "empty_text"),
        40: ("\ud800 lone surrogate", "invalid_encoding"),
        41: ("x" * 10_001, "payload_too_large"),
    }
    for position, (text, _) in bad.items():
        texts[position] = text
    results = client.classify_many(texts, chunk_size=16, concurrency=3)
    assert len(results) == len(texts)
    for position, result in enumerate(results):
        if position in bad:
            assert result.error is not None and result.error.code == bad[position][1]
        else:
            assert result.ok, (position, result)
    for position in (0, 39, 42, 119):
        alone = client.classify(texts[position])
        batched = results[position].prediction
        assert batched is not None and batched.label == alone.label
        assert batched.scores == pytest.approx(alone.scores, abs=1e-4)


def write_texts_file(path: Path, size: int = 500) -> list[bytes]:
    lines = [text.encode() for text in make_corpus(size=size, seed=5)]
    for position, (line, _) in BAD_LINES.items():
        lines[position] = line
    path.write_bytes(b"\n".join(lines) + b"\n")
    return lines


def test_cli_classifies_a_500_line_file_into_jsonl(server, tmp_path: Path) -> None:
    """The issue's 'done means': 500 texts, one command, a JSONL with per-line errors, exit 1."""
    texts_file, out = tmp_path / "texts.txt", tmp_path / "results.jsonl"
    write_texts_file(texts_file)
    key_file = server.state_dir / "key_file.json"
    command = [str(BERT_SERVE), "classify", "--file", str(texts_file), "--out", str(out)]
    command += ["--url", server.inference_url, "--key-file", str(key_file), "--no-progress"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 1, finished.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["line"] for row in rows] == list(range(1, 501))
    for position, row in enumerate(rows):
        if position in BAD_LINES:
            assert row["error"]["code"] == BAD_LINES[position][1], row
        else:
            assert row["label"] in ("positive", "negative") and "error" not in row, row
    assert "500 texts: 495 classified" in finished.stderr
    assert "5 failed (empty_text 3, invalid_encoding 1, payload_too_large 1)" in finished.stderr


def test_cli_one_text_finds_the_key_file_in_the_working_directory(server) -> None:
    finished = subprocess.run(
        [str(BERT_SERVE), "classify", "--url", server.inference_url, "An absolute delight."],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=server.state_dir,
    )
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout)["label"] == "positive"


def test_cli_without_a_token_fails_clearly(server, tmp_path: Path) -> None:
    finished = subprocess.run(
        [str(BERT_SERVE), "classify", "--url", server.inference_url, "fine"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert finished.returncode == 2
    assert "unauthorized" in finished.stderr and "--key-file" in finished.stderr


def test_the_commands_make_serve_prints_work_as_printed(server) -> None:
    """`make serve` ends by printing commands to paste: the curl ones and `bert-serve classify`."""
    lines = curl_example(server).splitlines()[1:]
    script = "\n".join(line for line in lines if "--file" not in line)
    finished = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert finished.returncode == 0, finished.stderr
    decoder, text, labels = json.JSONDecoder(), finished.stdout.strip(), []
    while text:
        body, end = decoder.raw_decode(text)
        labels.append(body["label"])
        text = text[end:].strip()
    assert labels == ["positive", "negative", "positive"]


PAIRS = [
    ("The film was a delight.", "Then the last hour ruined it."),
    ("A tedious, joyless mess.", "It had some fine moments."),
]


def post_raw(server, body: dict) -> dict:
    """The server's own answer, with plain requests: the reference the client must give back."""
    response = requests.post(
        f"{server.inference_url}/predictions/bert", json=body, headers=server.headers(), timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_pairs_answer_what_the_server_answers(server, client: Client) -> None:
    """A pair through classify and through classify_many (mixed with plain texts) scores what
    the raw API answers for `{"text", "text_pair"}`, and differs from the first text alone."""
    results = client.classify_many([PAIRS[0], "A plain text.", PAIRS[1]], chunk_size=2)
    for (text, pair), result in zip(PAIRS, (results[0], results[2]), strict=True):
        raw = post_raw(server, {"text": text, "text_pair": pair})
        one = client.classify(text, pair)
        assert result.prediction is not None and result.prediction.label == one.label
        assert one.label == raw["label"]
        assert one.scores == pytest.approx(raw["scores"], abs=1e-4)
        assert result.prediction.scores == pytest.approx(raw["scores"], abs=1e-4)
        assert one.scores != pytest.approx(client.classify(text).scores, abs=1e-4)


def test_top_k_keeps_the_best_labels_best_first(client: Client) -> None:
    text = "An absolute delight from start to finish."
    full = client.classify(text)
    best = client.classify(text, top_k=1)
    assert list(best.scores) == [full.label] and best.label == full.label
    assert best.scores[full.label] == pytest.approx(full.score, abs=1e-4)
    both = client.classify_many([text], top_k=5)[0].prediction
    assert both is not None
    assert list(both.scores) == sorted(full.scores, key=full.scores.__getitem__, reverse=True)


def test_raw_scores_are_the_logits_of_the_softmax(client: Client) -> None:
    """The sentiment model is single-label: its scores are the softmax of the raw scores."""
    for text in ("A tedious, joyless mess.", ("It rains.", "The street is wet.")):
        args = (text,) if isinstance(text, str) else text
        scores = client.classify(*args).scores
        raw = client.classify(*args, raw_scores=True)
        total = sum(math.exp(value) for value in raw.scores.values())
        softmax = {label: math.exp(value) / total for label, value in raw.scores.items()}
        assert softmax == pytest.approx(scores, abs=1e-4)
        assert raw.label == max(raw.scores, key=raw.scores.__getitem__)
        [listed] = client.classify_many([text], raw_scores=True)
        assert listed.prediction is not None
        assert listed.prediction.scores == pytest.approx(raw.scores, abs=1e-4)


def test_each_failure_raises_its_class(server, client: Client) -> None:
    """The real server's refusals, each as its class in bert_serve.exceptions."""
    cases = [
        (lambda: client.classify(" "), client_errors.InvalidText, "empty_text"),
        (lambda: client.classify("fine", "  "), client_errors.InvalidText, "empty_text"),
        (lambda: client.classify("x" * 10_001), client_errors.TextTooLong, "payload_too_large"),
        (lambda: client.classify("x" * 1_100_000), client_errors.BodyTooLarge, "payload_too_large"),
        (
            lambda: Client(server.inference_url, token="wrong").classify("fine"),
            client_errors.Unauthorized,
            "unauthorized",
        ),
        (
            lambda: Client(
                server.inference_url, model="nope", token=server.key("inference")
            ).classify("fine"),
            client_errors.ModelNotFound,
            "model_not_found",
        ),
    ]
    for call, error_class, code in cases:
        with pytest.raises(BertServeError) as caught:
            call()
        assert type(caught.value) is error_class and caught.value.code == code, caught.value


def test_cli_jsonl_pairs_with_top_k(server, tmp_path: Path) -> None:
    """`--jsonl` with texts and pairs and `--top-k 1`: one line out per line in, each
    answering what the client answers for the same input."""
    texts_file, out = tmp_path / "pairs.jsonl", tmp_path / "out.jsonl"
    lines = [json.dumps({"text": a, "text_pair": b}) for a, b in PAIRS]
    lines += [json.dumps("A plain text."), json.dumps({"text": "fine", "text_pair": ""})]
    texts_file.write_text("\n".join(lines) + "\n")
    command = [str(BERT_SERVE), "classify", "--file", str(texts_file), "--jsonl"]
    command += ["--out", str(out), "--top-k", "1", "--url", server.inference_url]
    command += ["--key-file", str(server.state_dir / "key_file.json"), "--no-progress"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 1, finished.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["line"] for row in rows] == [1, 2, 3, 4]
    assert rows[3]["error"]["code"] == "empty_text"
    client = Client(server.inference_url, token=server.key("inference"))
    for row, (text, pair) in zip(rows, PAIRS, strict=False):
        expected = client.classify(text, pair)
        assert list(row["scores"]) == [expected.label] == [row["label"]]
    assert "4 texts: 3 classified" in finished.stderr
