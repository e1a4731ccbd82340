"""The Python client and CLI against a scripted local HTTP stub: chunking, order, retries, errors."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from bert_serve import cli
from bert_serve import client as client_module
from bert_serve.client import (
    BertServeError,
    Client,
    ItemError,
    ItemResult,
    chunk_texts,
    token_from_key_file,
)
from harness.config import free_port
from tests.conftest import ROOT

Reply = tuple[int, Any]  # (status, JSON body or None for an empty body)


def prediction_for(text: str) -> dict[str, Any]:
    """A fake prediction that names its text, so a test can see which answer went where."""
    return {
        "label": f"label-{len(text)}",
        "score": 0.5,
        "scores": {"a": 0.5, "b": 0.5},
        "truncated": False,
        "text": text,
    }


def echo(body: dict[str, Any]) -> Reply:
    if "texts" in body:
        results = [
            {"error": {"code": "empty_text", "message": "text is empty"}}
            if not t.strip()
            else prediction_for(t)
            for t in body["texts"]
        ]
        return 200, {"results": results, "request_id": "r"}
    if not body["text"].strip():
        return 400, {"error": {"code": "empty_text", "message": "text is empty"}, "request_id": "r"}
    return 200, prediction_for(body["text"])


class Stub:
    """A local HTTP server whose answers come from `reply(body) -> (status, json)`; records requests."""

    def __init__(self, reply: Callable[[dict[str, Any]], Reply]):
        self.reply = reply
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append((dict(self.headers), body))
                status, answer = stub.reply(body)
                data = b"" if answer is None else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)


@pytest.fixture
def stub_factory() -> Iterator[Callable[..., Stub]]:
    started: list[Stub] = []

    def start(reply: Callable[[dict[str, Any]], Reply] = echo) -> Stub:
        stub = Stub(reply)
        stub.thread.start()
        started.append(stub)
        return stub

    yield start
    for stub in started:
        stub.server.shutdown()
        stub.server.server_close()


def client_for(stub: Stub, **options: Any) -> tuple[Client, list[float]]:
    sleeps: list[float] = []
    return Client(stub.url, sleep=sleeps.append, **options), sleeps


def test_chunks_respect_count_and_bytes_and_keep_every_text_in_order() -> None:
    texts = [f"text {i}" * (i % 7 + 1) for i in range(200)]
    chunks = list(chunk_texts(texts, chunk_size=16, max_request_bytes=600))
    assert [t for chunk in chunks for t in chunk] == texts
    assert all(1 <= len(chunk) <= 16 for chunk in chunks)
    assert all(len(json.dumps({"texts": chunk})) <= 600 for chunk in chunks)


def test_a_text_over_the_byte_cap_goes_alone() -> None:
    chunks = list(chunk_texts(["a", "b" * 5000, "c"], chunk_size=64, max_request_bytes=1000))
    assert chunks == [["a"], ["b" * 5000], ["c"]]


def test_non_string_texts_are_refused_before_sending() -> None:
    with pytest.raises(TypeError, match="int"):
        list(chunk_texts(["ok", 3], chunk_size=4, max_request_bytes=1000))  # type: ignore[list-item]


def test_classify_sends_token_and_request_id(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory()
    client, _ = client_for(stub, token="secret")
    prediction = client.classify("good film")
    assert prediction.label == "label-9"
    headers = stub.requests[0][0]
    assert headers["Authorization"] == "Bearer secret"
    assert headers["X-Request-ID"].startswith("bert-serve-")


def test_classify_raises_the_handlers_error_code_without_retrying(
    stub_factory: Callable[..., Stub],
) -> None:
    stub = stub_factory()
    client, sleeps = client_for(stub)
    with pytest.raises(BertServeError) as caught:
        client.classify("   ")
    assert (caught.value.code, caught.value.status, caught.value.request_id) == (
        "empty_text",
        400,
        "r",
    )
    assert len(stub.requests) == 1 and sleeps == []


def test_503_and_507_are_retried_with_growing_backoff(stub_factory: Callable[..., Stub]) -> None:
    replies = iter(
        [
            (503, {"code": 503, "type": "ServiceUnavailableException", "message": "full"}),
            (507, None),
        ]
    )
    stub = stub_factory(lambda body: next(replies, None) or echo(body))
    client, sleeps = client_for(stub, backoff=1.0, max_backoff=100.0)
    assert client.classify("fine").label == "label-4"
    assert len(stub.requests) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 1.0 and 0 <= sleeps[1] <= 2.0


def test_retries_give_up_with_the_last_error(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory(
        lambda body: (
            503,
            {"code": 503, "type": "ServiceUnavailableException", "message": "queue full"},
        )
    )
    client, sleeps = client_for(stub, retries=3)
    with pytest.raises(BertServeError) as caught:
        client.classify("x")
    assert (caught.value.code, caught.value.status, caught.value.message) == (
        "unavailable",
        503,
        "queue full",
    )
    assert len(stub.requests) == 4 and len(sleeps) == 3


def test_connection_errors_are_retried_then_raised() -> None:
    client = Client(f"http://127.0.0.1:{free_port()}", retries=2, sleep=lambda _: None, timeout=5)
    with pytest.raises(BertServeError) as caught:
        client.classify("x")
    assert caught.value.code == "connection_failed" and caught.value.status is None


def test_a_malformed_url_is_a_typed_error() -> None:
    with pytest.raises(BertServeError, match="request_failed"):
        Client("127.0.0.1:8080").classify("x")


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (
            400,
            {"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed"},
            "unauthorized",
        ),
        (
            404,
            {"code": 404, "type": "ModelNotFoundException", "message": "Model not found"},
            "model_not_found",
        ),
        (413, None, "payload_too_large"),
        (500, {"code": 500, "type": "InternalServerException", "message": "boom"}, "http_500"),
    ],
)
def test_torchserve_errors_get_a_code(
    stub_factory: Callable[..., Stub], status: int, body: Any, code: str
) -> None:
    stub = stub_factory(lambda _: (status, body))
    client, _ = client_for(stub)
    with pytest.raises(BertServeError) as caught:
        client.classify("x")
    assert (caught.value.code, caught.value.status) == (code, status)


def test_classify_many_keeps_order_under_concurrency(stub_factory: Callable[..., Stub]) -> None:
    """Chunks answer out of order (later chunks faster); results must still come back in input order."""

    def slow_first(body: dict[str, Any]) -> Reply:
        time.sleep(0.05 if body["texts"][0].endswith(" 0") else 0.0)
        return echo(body)

    stub = stub_factory(slow_first)
    client, _ = client_for(stub)
    texts = [f"text number {i}" if i % 10 else "" for i in range(1, 101)]
    texts = ["text number 0", *texts]
    results = client.classify_many(texts, chunk_size=7, concurrency=4)
    assert len(results) == len(texts) == 101
    assert len(stub.requests) == 15
    for text, result in zip(texts, results, strict=True):
        if text:
            assert (
                result.ok
                and result.prediction is not None
                and result.prediction.label == f"label-{len(text)}"
            )
        else:
            assert result.error == ItemError("empty_text", "text is empty")


def test_a_failed_chunk_fails_only_its_own_texts(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory(lambda body: (413, None) if "huge" in body["texts"] else echo(body))
    client, _ = client_for(stub)
    results = client.classify_many(["a", "b", "huge", "c", "d"], chunk_size=2)
    assert [r.ok for r in results] == [True, True, False, False, True]
    assert results[2].error is not None and results[2].error.code == "payload_too_large"


def test_a_request_wide_error_stops_classify_many(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory(
        lambda _: (400, {"code": 400, "type": "InvalidKeyException", "message": "bad token"})
    )
    client, _ = client_for(stub)
    with pytest.raises(BertServeError, match="unauthorized"):
        client.classify_many(["a"] * 10, chunk_size=2, concurrency=2)


def test_an_attempt_with_no_answer_is_retried_after_the_deadline(
    stub_factory: Callable[..., Stub],
) -> None:
    """A request TorchServe dropped without an answer (a worker died while collecting its batch)
    must not hang the call: after `timeout` the client sends it again, and the retry succeeds."""
    release = threading.Event()
    attempts = iter(range(100))

    def first_never_answers(body: dict[str, Any]) -> Reply:
        if next(attempts) == 0:
            release.wait(30)
        return echo(body)

    stub = stub_factory(first_never_answers)
    client, sleeps = client_for(stub, timeout=0.3)
    started = time.monotonic()
    try:
        assert client.classify("fine").label == "label-4"
    finally:
        release.set()
    assert len(stub.requests) == 2 and len(sleeps) == 1
    assert 0.3 <= time.monotonic() - started < 5


def test_a_call_with_no_answers_at_all_ends_within_its_bound(
    stub_factory: Callable[..., Stub],
) -> None:
    """Never hang: (retries + 1) attempts of `timeout` each plus the backoff sleeps, then `timeout`."""
    release = threading.Event()
    stub = stub_factory(lambda body: (release.wait(30), echo(body))[1])
    client = Client(stub.url, timeout=0.2, retries=2, backoff=0.05, max_backoff=0.1)
    started = time.monotonic()
    try:
        with pytest.raises(BertServeError) as caught:
            client.classify("x")
    finally:
        release.set()
    elapsed = time.monotonic() - started
    assert caught.value.code == "timeout" and caught.value.status is None
    assert len(stub.requests) == 3
    assert 3 * 0.2 <= elapsed < 3 * 0.2 + 2 * 0.1 + 2.0


WORKER_DIED = {"code": 500, "type": "InternalServerException", "message": "Worker died."}


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, WORKER_DIED),
        (507, {**WORKER_DIED, "code": 507}),
        (413, {**WORKER_DIED, "code": 413}),
        (500, {**WORKER_DIED, "message": "Worker scaled down."}),
        (503, {"code": 503, "type": "ServiceUnavailableException", "message": "Prediction failed"}),
        (507, None),
    ],
)
def test_every_worker_died_answer_is_retried(
    stub_factory: Callable[..., Stub], status: int, body: Any
) -> None:
    """TorchServe answers a dead worker's requests with 500, 507 or the worker's own status;
    the message, not the status, says the worker died."""
    replies = iter([(status, body)])
    stub = stub_factory(lambda request: next(replies, None) or echo(request))
    client, sleeps = client_for(stub)
    assert client.classify("fine").label == "label-4"
    assert len(stub.requests) == 2 and len(sleeps) == 1


def test_worker_died_after_the_retries_has_its_own_code(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory(lambda _: (500, WORKER_DIED))
    client, _ = client_for(stub, retries=1)
    with pytest.raises(BertServeError) as caught:
        client.classify("x")
    assert (caught.value.code, caught.value.status) == ("worker_died", 500)
    assert len(stub.requests) == 2


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (413, None),
        (
            413,
            {"error": {"code": "payload_too_large", "message": "Worker died."}, "request_id": "r"},
        ),
        (
            500,
            {"error": {"code": "internal_error", "message": "the model failed"}, "request_id": "r"},
        ),
        (500, {"code": 500, "type": "InternalServerException", "message": "boom"}),
    ],
)
def test_final_answers_are_not_retried(
    stub_factory: Callable[..., Stub], status: int, body: Any
) -> None:
    """A real 413 (the body-size limit, or the handler's own) and other errors are final."""
    stub = stub_factory(lambda _: (status, body))
    client, sleeps = client_for(stub)
    with pytest.raises(BertServeError):
        client.classify("x")
    assert len(stub.requests) == 1 and sleeps == []


def test_the_default_deadline_follows_the_servers_response_timeout() -> None:
    """The client's constant must be the responseTimeout the .mar ships with."""
    config = yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())
    assert client_module.SERVER_RESPONSE_TIMEOUT_S == config["responseTimeout"]
    assert Client().timeout == client_module.DEFAULT_TIMEOUT_S > config["responseTimeout"]


@pytest.mark.parametrize(
    "body", [[1, 2], {"label": "x"}, {"label": "x", "score": "high", "scores": {}}]
)
def test_a_200_that_is_not_a_prediction_is_a_bad_response(
    stub_factory: Callable[..., Stub], body: Any
) -> None:
    stub = stub_factory(lambda _: (200, body))
    client, _ = client_for(stub)
    with pytest.raises(BertServeError, match="bad_response"):
        client.classify("x")


def test_a_short_results_list_is_a_bad_response(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory(lambda body: (200, {"results": [], "request_id": "r"}))
    client, _ = client_for(stub)
    with pytest.raises(BertServeError, match="bad_response"):
        client.classify_many(["a", "b"])


def test_token_from_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    key_file.write_text(
        json.dumps(
            {"inference": {"key": "abc", "expiration time": "x"}, "management": {"key": "m"}}
        )
    )
    assert token_from_key_file(key_file) == "abc"
    key_file.write_text("{}")
    with pytest.raises(BertServeError, match="invalid_key_file"):
        token_from_key_file(key_file)


def test_read_lines_keeps_one_text_per_line_and_marks_bad_bytes() -> None:
    data = b"\xef\xbb\xbffirst\r\nsecond\n\nbad \xff byte\nno newline at end"
    lines = list(cli.read_lines(io.BytesIO(data)))
    assert lines[:3] == ["first", "second", ""]
    assert lines[3] == "bad \udcff byte"
    assert lines[4] == "no newline at end"
    assert len(lines) == 5


def test_summary_counts_labels_and_error_codes() -> None:
    outcomes = cli.Counter({"positive": 3, "negative": 1, "error:empty_text": 2})
    assert (
        cli.summary(outcomes)
        == "6 texts: 4 classified (positive 3, negative 1), 2 failed (empty_text 2)"
    )


def test_cli_file_to_jsonl_with_per_line_errors(
    stub_factory: Callable[..., Stub], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub = stub_factory()
    texts = tmp_path / "texts.txt"
    texts.write_text("good\n\nfine film\n")
    out = tmp_path / "results.jsonl"
    code = cli.main(
        [
            "classify",
            "--url",
            stub.url,
            "--file",
            str(texts),
            "--out",
            str(out),
            "--chunk-size",
            "2",
        ]
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == cli.EXIT_ITEM_FAILED
    assert [line["line"] for line in lines] == [1, 2, 3]
    assert lines[0]["label"] == "label-4" and lines[2]["label"] == "label-9"
    assert lines[1]["error"]["code"] == "empty_text"
    assert "3 texts: 2 classified" in capsys.readouterr().err


def test_cli_exit_codes(
    stub_factory: Callable[..., Stub], capsys: pytest.CaptureFixture[str]
) -> None:
    stub = stub_factory()
    assert cli.main(["classify", "--url", stub.url, "great"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["label"] == "label-5"
    assert cli.main(["classify", "--url", stub.url, " "]) == cli.EXIT_ITEM_FAILED
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "empty_text"
    down = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["classify", "--url", down, "--retries", "0", "x"]) == cli.EXIT_FAILED
    assert "connection_failed" in capsys.readouterr().err


def test_cli_stops_on_a_request_wide_error_and_says_how_far_it_got(
    stub_factory: Callable[..., Stub], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_token = (400, {"code": 400, "type": "InvalidKeyException", "message": "Token expired"})
    stub = stub_factory(lambda body: bad_token if "third" in body["texts"] else echo(body))
    texts, out = tmp_path / "texts.txt", tmp_path / "out.jsonl"
    texts.write_text("first\nsecond\nthird\nfourth\n")
    command = ["classify", "--url", stub.url, "--file", str(texts), "--out", str(out)]
    assert cli.main([*command, "--chunk-size", "2", "--concurrency", "1"]) == cli.EXIT_FAILED
    assert len(out.read_text().splitlines()) == 2
    assert "unauthorized" in (err := capsys.readouterr().err) and "stopped after 2 texts" in err


def test_cli_reads_the_key_file(stub_factory: Callable[..., Stub], tmp_path: Path) -> None:
    stub = stub_factory()
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"inference": {"key": "from-file"}}))
    assert (
        cli.main(["classify", "--url", stub.url, "--key-file", str(key_file), "great"])
        == cli.EXIT_OK
    )
    assert stub.requests[0][0]["Authorization"] == "Bearer from-file"


def test_cli_token_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags beat environment variables, which beat a key file found in the working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "key_file.json").write_text(json.dumps({"inference": {"key": "found"}}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"inference": {"key": "other"}}))
    assert cli.resolve_token(cli.parse_args(["classify", "x"])) == "found"
    monkeypatch.setenv("BERT_SERVE_TOKEN", "env")
    assert cli.resolve_token(cli.parse_args(["classify", "x"])) == "env"
    assert cli.resolve_token(cli.parse_args(["classify", "--key-file", str(other), "x"])) == "other"
    assert cli.resolve_token(cli.parse_args(["classify", "--token", "flag", "x"])) == "flag"


def test_item_result_json_shapes() -> None:
    assert ItemResult(error=ItemError("empty_text", "m")).to_json() == {
        "error": {"code": "empty_text", "message": "m"}
    }
    with pytest.raises(ValueError, match="not both or neither"):
        ItemResult()
