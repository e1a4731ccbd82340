"""The Python client and CLI against a scripted local HTTP stub: chunking, order, retries,
the API's options and pairs, and the exception tree.

These are the client's unit tests: they run on every Python the client supports (3.9 to 3.13,
scripts/test_client_pythons.sh) with only the client's install and pytest, so this file
imports nothing of the server side and no syntax or library newer than 3.9. The few that
check the client against the server's own files are marked `server_side`; those run with the
whole suite."""

from __future__ import annotations

import ast
import io
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Union

import pytest

from bert_serve import cli, exceptions
from bert_serve import client as client_module
from bert_serve.client import (
    BertServeError,
    Client,
    ItemError,
    ItemResult,
    chunk_texts,
    token_from_key_file,
)
from tests.conftest import ROOT

Reply = Union[tuple[int, Any], tuple[int, Any, dict[str, str]]]
# (status, JSON body or None for an empty body[, response headers])


def unused_port() -> int:
    """A local port nothing listens on (the OS's pick for a socket closed at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
        texts = [t if isinstance(t, str) else t["text"] for t in body["texts"]]
        results = [
            {"error": {"code": "empty_text", "message": "text is empty"}}
            if not t.strip()
            else prediction_for(t)
            for t in texts
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
        self.paths: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append((dict(self.headers), body))
                stub.paths.append(self.path)
                status, answer, *more = stub.reply(body)
                data = b"" if answer is None else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    for name, value in (more[0] if more else {}).items():
                        self.send_header(name, value)
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
    assert isinstance(caught.value, exceptions.InvalidText)
    assert caught.value.code is exceptions.ErrorCode.EMPTY_TEXT
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
    assert isinstance(caught.value, (exceptions.Unavailable, exceptions.ServerError))
    assert len(stub.requests) == 4 and len(sleeps) == 3


def test_connection_errors_are_retried_then_raised() -> None:
    client = Client(f"http://127.0.0.1:{unused_port()}", retries=2, sleep=lambda _: None, timeout=5)
    with pytest.raises(BertServeError) as caught:
        client.classify("x")
    assert caught.value.code == "connection_failed" and caught.value.status is None
    assert isinstance(caught.value, (exceptions.ConnectError, exceptions.TransportError))


def test_a_malformed_url_is_a_typed_error() -> None:
    with pytest.raises(exceptions.RequestFailed, match="request_failed"):
        Client("127.0.0.1:8080").classify("x")


@pytest.mark.parametrize(
    ("status", "body", "code", "error_class"),
    [
        (
            400,
            {"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed"},
            "unauthorized",
            exceptions.Unauthorized,
        ),
        (401, None, "unauthorized", exceptions.Unauthorized),
        (
            404,
            {"code": 404, "type": "ModelNotFoundException", "message": "Model not found"},
            "model_not_found",
            exceptions.ModelNotFound,
        ),
        (413, None, "payload_too_large", exceptions.BodyTooLarge),
        (
            500,
            {"code": 500, "type": "InternalServerException", "message": "boom"},
            "http_500",
            exceptions.UnexpectedStatus,
        ),
    ],
)
def test_torchserve_errors_get_a_code_and_a_class(
    stub_factory: Callable[..., Stub],
    status: int,
    body: Any,
    code: str,
    error_class: type[BertServeError],
) -> None:
    stub = stub_factory(lambda _: (status, body))
    client, _ = client_for(stub)
    with pytest.raises(exceptions.ServerError) as caught:
        client.classify("x")
    assert (caught.value.code, caught.value.status) == (code, status)
    assert type(caught.value) is error_class


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
    for text, result in zip(texts, results):
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
    assert isinstance(caught.value, (exceptions.Timeout, exceptions.TransportError))
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
    assert isinstance(caught.value, exceptions.WorkerDied)
    assert len(stub.requests) == 2


@pytest.mark.parametrize(
    ("status", "body", "error_class"),
    [
        (413, None, exceptions.BodyTooLarge),
        (
            413,
            {"error": {"code": "payload_too_large", "message": "Worker died."}, "request_id": "r"},
            exceptions.TextTooLong,
        ),
        (
            500,
            {"error": {"code": "internal_error", "message": "the model failed"}, "request_id": "r"},
            exceptions.ModelFailed,
        ),
        (
            500,
            {"code": 500, "type": "InternalServerException", "message": "boom"},
            exceptions.UnexpectedStatus,
        ),
    ],
)
def test_final_answers_are_not_retried(
    stub_factory: Callable[..., Stub], status: int, body: Any, error_class: type[BertServeError]
) -> None:
    """A real 413 (the body-size limit, or the handler's own) and other errors are final."""
    stub = stub_factory(lambda _: (status, body))
    client, sleeps = client_for(stub)
    with pytest.raises(error_class):
        client.classify("x")
    assert len(stub.requests) == 1 and sleeps == []


@pytest.mark.server_side
def test_the_default_deadline_follows_the_servers_response_timeout() -> None:
    """The client's constant must be the responseTimeout the .mar ships with."""
    import yaml

    config = yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())
    assert client_module.SERVER_RESPONSE_TIMEOUT_S == config["responseTimeout"]
    assert Client().timeout == client_module.DEFAULT_TIMEOUT_S > config["responseTimeout"]


@pytest.mark.server_side
def test_list_requests_stay_within_the_servers_max_request_size() -> None:
    """The client's byte cap for one list request is the max_request_size the server ships."""
    from bert_serve_server.config import BASE_CONFIG, read_properties

    shipped = read_properties(BASE_CONFIG)["max_request_size"]
    assert client_module.DEFAULT_MAX_REQUEST_BYTES == int(shipped)


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {"label": "x"},
        {"label": "x", "score": "high", "scores": {}},
        {"label": "x", "score": 1.0, "scores": {"x": 1.0}, "labels": "x"},
    ],
)
def test_a_200_that_is_not_a_prediction_is_a_bad_response(
    stub_factory: Callable[..., Stub], body: Any
) -> None:
    stub = stub_factory(lambda _: (200, body))
    client, _ = client_for(stub)
    with pytest.raises(exceptions.BadResponse, match="bad_response"):
        client.classify("x")


def test_a_short_results_list_is_a_bad_response(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory(lambda body: (200, {"results": [], "request_id": "r"}))
    client, _ = client_for(stub)
    with pytest.raises(exceptions.BadResponse, match="bad_response"):
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
    with pytest.raises(exceptions.InvalidKeyFile, match="invalid_key_file"):
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
    down = f"http://127.0.0.1:{unused_port()}"
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


def test_cli_takes_keys_that_begin_with_a_dash() -> None:
    """TorchServe's keys are URL-safe base64: one in 64 begins with "-" (this one did, in CI)."""
    args = cli.parse_args(["explain", "great film", "--token", "-r3_aubd", "--url", "http://h"])
    assert (args.token, args.text, args.url) == ("-r3_aubd", "great film", "http://h")
    assert cli.parse_args(["classify", "--key", "-k", "x"]).key == "-k"
    assert cli.parse_args(["models", "--token", "--json"]).token == "--json"
    assert cli.parse_args(["classify", "--", "--token"]).text == "--token"
    with pytest.raises(SystemExit):
        cli.parse_args(["classify", "x", "--token"])


def test_item_result_json_shapes() -> None:
    assert ItemResult(error=ItemError("empty_text", "m")).to_json() == {
        "error": {"code": "empty_text", "message": "m"}
    }
    with pytest.raises(ValueError, match="not both or neither"):
        ItemResult()


def answer_with_body(body: dict[str, Any]) -> Reply:
    """A prediction whose `scores` carry the request's options back, so a test sees them."""
    options = {key: body[key] for key in ("top_k", "raw_scores", "windows") if key in body}
    prediction = {"label": "a", "score": 0.5, "scores": {"a": 0.5}, "truncated": False}
    if "texts" in body:
        return 200, {"results": [{**prediction, "sent": options}] * len(body["texts"])}
    return 200, {**prediction, "sent": options}


def test_classify_sends_a_pair_and_the_options(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory(answer_with_body)
    client, _ = client_for(stub)
    client.classify("It rains.", "The street is wet.", top_k=2, raw_scores=True)
    client.classify("plain")
    assert [body for _, body in stub.requests] == [
        {"text": "It rains.", "text_pair": "The street is wet.", "top_k": 2, "raw_scores": True},
        {"text": "plain"},
    ]


def test_classify_many_sends_pairs_as_objects_and_the_options_on_every_chunk(
    stub_factory: Callable[..., Stub],
) -> None:
    stub = stub_factory(answer_with_body)
    client, _ = client_for(stub)
    texts: list[client_module.Text] = ["one", ("two", "pair of two"), "three"]
    results = client.classify_many(texts, chunk_size=2, concurrency=1, top_k=1)
    assert [r.ok for r in results] == [True, True, True]
    assert [body for _, body in stub.requests] == [
        {"texts": ["one", {"text": "two", "text_pair": "pair of two"}], "top_k": 1},
        {"texts": ["three"], "top_k": 1},
    ]


@pytest.mark.parametrize(
    "options",
    [
        {"top_k": 0},
        {"top_k": True},
        {"top_k": 1.5},
        {"raw_scores": "yes"},
        {"raw_scores": 1},
        {"windows": "yes"},
        {"windows": 0},
    ],
)
def test_bad_options_are_refused_before_sending(
    stub_factory: Callable[..., Stub], options: dict[str, Any]
) -> None:
    """A bad option would fail every chunk of a long run; it fails at once, here."""
    stub = stub_factory()
    client, _ = client_for(stub)
    with pytest.raises(ValueError, match="top_k|raw_scores|windows"):
        client.classify("x", **options)
    with pytest.raises(ValueError, match="top_k|raw_scores|windows"):
        client.classify_many(["x"], **options)
    assert stub.requests == []


def test_windows_is_sent_only_when_given(stub_factory: Callable[..., Stub]) -> None:
    """`windows=None` leaves the choice to the model's long_texts setting: no field at all;
    True and False go as JSON booleans, on one text and on every chunk of a list."""
    stub = stub_factory(answer_with_body)
    client, _ = client_for(stub)
    client.classify("long", windows=True)
    client.classify("long", windows=False)
    client.classify("long")
    client.classify_many(["a", "b", "c"], chunk_size=2, concurrency=1, windows=False)
    client.classify_many(["a"])
    assert [body for _, body in stub.requests] == [
        {"text": "long", "windows": True},
        {"text": "long", "windows": False},
        {"text": "long"},
        {"texts": ["a", "b"], "windows": False},
        {"texts": ["c"], "windows": False},
        {"texts": ["a"]},
    ]


def test_a_windowed_answer_keeps_its_windows(stub_factory: Callable[..., Stub]) -> None:
    """A text of more than one window answers `"windows": n`; the client keeps it through
    classify, classify_many and the JSON it writes, and a one-window answer has none."""
    windowed = {"label": "a", "score": 0.7, "scores": {"a": 0.7}, "truncated": False, "windows": 3}
    short = {"label": "a", "score": 0.6, "scores": {"a": 0.6}, "truncated": False}

    def reply(body: dict[str, Any]) -> Reply:
        if "texts" in body:
            return 200, {"results": [windowed if len(t) > 3 else short for t in body["texts"]]}
        return 200, windowed

    stub = stub_factory(reply)
    client, _ = client_for(stub)
    prediction = client.classify("long text")
    assert prediction.windows == 3 and prediction.to_json() == windowed
    long_one, short_one = client.classify_many(["long text", "hi"])
    assert long_one.prediction == prediction and long_one.to_json()["windows"] == 3
    assert short_one.prediction is not None and short_one.prediction.windows is None
    assert "windows" not in short_one.to_json()


@pytest.mark.parametrize("windows", ["3", 2.5, True, [2]])
def test_a_windows_field_that_is_not_a_whole_number_is_a_bad_response(
    stub_factory: Callable[..., Stub], windows: Any
) -> None:
    answer = {"label": "a", "score": 0.5, "scores": {"a": 0.5}, "windows": windows}
    stub = stub_factory(lambda _: (200, answer))
    client, _ = client_for(stub)
    with pytest.raises(client_module.BadResponse, match="not a prediction"):
        client.classify("x")


WINDOWS_LIMIT = 3


def windows_limited(body: dict[str, Any]) -> Reply:
    """A server that takes at most WINDOWS_LIMIT windows a request, a text one window per
    word: past it the whole list is refused 413, as the handler refuses it."""
    texts = body["texts"]
    windows = sum(len(t.split()) for t in texts)
    if windows > WINDOWS_LIMIT:
        message = f"the request's texts make {windows} windows; the limit is {WINDOWS_LIMIT}"
        return 413, {"error": {"code": "payload_too_large", "message": message}}
    return echo(body)


def test_a_list_refused_for_its_windows_is_sent_again_in_halves(
    stub_factory: Callable[..., Stub],
) -> None:
    """A chunk of long texts may make more windows than max_windows_per_request (413 for the
    whole list): its halves go in turn, down to one text, so each text that fits is answered,
    in order, and only a text past the limit alone is refused."""
    stub = stub_factory(windows_limited)
    client, _ = client_for(stub)
    texts = ["a b", "c", "d e f", "g h i j", "k", "l m"]
    results = client.classify_many(texts, chunk_size=6, concurrency=1)
    assert [r.prediction.label if r.prediction else r.error.code for r in results] == [  # type: ignore[union-attr]
        "label-3",
        "label-1",
        "label-5",
        "payload_too_large",
        "label-1",
        "label-3",
    ]
    assert [body["texts"] for _, body in stub.requests] == [
        texts,
        texts[:3],
        ["a b"],
        ["c", "d e f"],
        ["c"],
        ["d e f"],
        texts[3:],
        ["g h i j"],
        ["k", "l m"],
    ]


def test_other_refusals_of_a_whole_list_are_not_split(stub_factory: Callable[..., Stub]) -> None:
    """Only a list refused as too large is worth sending in parts; a 504 or a 500 for the whole
    list stays every text's error, in one request."""
    body = {"error": {"code": "internal_error", "message": "m"}}
    stub = stub_factory(lambda _: (500, body))
    client, _ = client_for(stub, retries=0)
    results = client.classify_many(["a", "b", "c"], chunk_size=3)
    assert [r.error.code for r in results] == ["internal_error"] * 3  # type: ignore[union-attr]
    assert len(stub.requests) == 1


@pytest.mark.parametrize(
    ("arguments", "sent"),
    [([], None), (["--windows"], True), (["--no-windows"], False)],
)
def test_cli_windows_option(
    stub_factory: Callable[..., Stub],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    sent: bool | None,
) -> None:
    """--windows / --no-windows send the option with one text and with every chunk of a file;
    neither sends nothing, so the model's setting decides."""
    stub = stub_factory(answer_with_body)
    texts = tmp_path / "in.txt"
    texts.write_text("one\ntwo\n")
    assert cli.main(["classify", "--url", stub.url, "x", *arguments]) == cli.EXIT_OK
    command = ["classify", "--url", stub.url, "--file", str(texts), "--no-progress"]
    assert cli.main([*command, *arguments]) == cli.EXIT_OK
    bodies = [body for _, body in stub.requests]
    assert [body.get("windows") for body in bodies] == [sent, sent]
    assert all(("windows" in body) == (sent is not None) for body in bodies)


@pytest.mark.parametrize("bad", [("only one",), ("a", 2), ["a", "b"], 3])
def test_a_text_is_a_string_or_a_pair_of_strings(bad: Any) -> None:
    with pytest.raises(TypeError, match="str"):
        list(chunk_texts(["ok", bad], chunk_size=4, max_request_bytes=1000))


def test_chunks_with_pairs_and_options_stay_under_the_byte_cap() -> None:
    texts: list[client_module.Text] = [
        (f"premise {i}" * (i % 5 + 1), f"hypothesis {i}") if i % 2 else f"text {i}"
        for i in range(100)
    ]
    options = {"top_k": 3, "raw_scores": True}
    chunks = list(chunk_texts(texts, chunk_size=16, max_request_bytes=500, options=options))
    assert [t for chunk in chunks for t in chunk] == texts
    for chunk in chunks:
        body = {"texts": [client_module.wire_item(t) for t in chunk], **options}
        assert len(json.dumps(body)) <= 500


def test_a_multi_label_answer_keeps_its_labels(stub_factory: Callable[..., Stub]) -> None:
    """A multi-label model answers `labels` (every label over its threshold); the client keeps
    them, in the server's order, through classify, classify_many and the JSON it writes."""
    answer = {
        "label": "b",
        "score": 0.9,
        "scores": {"a": 0.6, "b": 0.9, "c": 0.1},
        "truncated": False,
        "labels": ["b", "a"],
    }
    stub = stub_factory(lambda body: (200, {"results": [answer]} if "texts" in body else answer))
    client, _ = client_for(stub)
    prediction = client.classify("x")
    assert prediction.labels == ("b", "a")
    assert prediction.to_json() == {key: answer[key] for key in answer}
    [result] = client.classify_many(["x"])
    assert result.prediction == prediction and result.to_json()["labels"] == ["b", "a"]


def test_a_single_label_answer_has_no_labels(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory()
    client, _ = client_for(stub)
    prediction = client.classify("fine")
    assert prediction.labels is None and "labels" not in prediction.to_json()


@pytest.mark.server_side
def test_the_client_codes_are_the_servers_error_table() -> None:
    """The client mirrors handler/values.py (it cannot import it: it installs without the
    server); this keeps the copy equal to the one table, codes and statuses."""
    from handler.values import HTTP_STATUS, ErrorCode

    assert {code.value for code in exceptions.ErrorCode} == {code.value for code in ErrorCode}
    assert {code.value: status for code, status in exceptions.ERROR_STATUS.items()} == {
        code.value: status for code, (status, _) in HTTP_STATUS.items()
    }


@pytest.mark.parametrize("code", list(exceptions.ErrorCode))
def test_each_handler_code_raises_the_class_of_its_status(
    stub_factory: Callable[..., Stub], code: exceptions.ErrorCode
) -> None:
    status = exceptions.ERROR_STATUS[code]
    body = {"error": {"code": code.value, "message": "m"}, "request_id": "r"}
    stub = stub_factory(lambda _: (status, body))
    client, _ = client_for(stub)
    with pytest.raises(exceptions.Rejected) as caught:
        client.classify("x")
    assert type(caught.value) is exceptions.REJECTED_BY_STATUS[status]
    assert (caught.value.code, caught.value.status, caught.value.message) == (code, status, "m")


def test_a_code_the_client_does_not_know_is_still_a_rejection(
    stub_factory: Callable[..., Stub],
) -> None:
    """A newer server may add a code: it arrives as a plain `Rejected` with that code."""
    body = {"error": {"code": "too_many_emoji", "message": "m"}, "request_id": "r"}
    stub = stub_factory(lambda _: (422, body))
    client, _ = client_for(stub)
    with pytest.raises(exceptions.Rejected) as caught:
        client.classify("x")
    assert type(caught.value) is exceptions.Rejected
    assert (caught.value.code, caught.value.status) == ("too_many_emoji", 422)


def test_the_docstring_draws_every_exception_class() -> None:
    """The tree in bert_serve/exceptions.py's docstring is the reference; every class is in it,
    under its real base."""
    classes = {
        name: value
        for name, value in vars(exceptions).items()
        if isinstance(value, type) and issubclass(value, BertServeError)
    }
    drawn: dict[str, str] = {}
    parents: list[str] = []
    for line in (exceptions.__doc__ or "").splitlines():
        match = re.match(r"^    ([│ ]*)(?:[├└]── )?([A-Z]\w+)\s", line)
        if match is None:
            continue
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        parents[depth:] = [match.group(2)]
        drawn[match.group(2)] = parents[depth - 1] if depth else ""
    assert set(drawn) == set(classes)
    for name, parent in drawn.items():
        bases = classes[name].__bases__
        assert bases == ((classes[parent],) if parent else (Exception,)), name


def test_item_results_keep_the_error_code_of_a_failed_chunk(
    stub_factory: Callable[..., Stub],
) -> None:
    """A chunk that failed whole (here: its worker died on every attempt) gives each of its
    texts that error's code; request-wide errors raise instead (see the test above)."""
    stub = stub_factory(lambda _: (500, WORKER_DIED))
    client, _ = client_for(stub, retries=0)
    results = client.classify_many(["a", "b"], chunk_size=1)
    assert [r.error for r in results] == [ItemError("worker_died", "Worker died.")] * 2


@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.stdlib_module_names is 3.10's")
def test_the_client_imports_only_the_stdlib_requests_and_tqdm() -> None:
    """The client installs with requests and tqdm alone: no module of it may import more."""
    allowed = set(sys.stdlib_module_names) | {"requests", "tqdm", "bert_serve"}
    for path in sorted((ROOT / "bert_serve").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_cli_jsonl_pairs_and_options(
    stub_factory: Callable[..., Stub], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--jsonl lines are strings or {"text", "text_pair"} objects; --top-k and --raw-scores go
    with every request; the output is one JSON line per input line, as for plain lines."""
    stub = stub_factory(answer_with_body)
    texts, out = tmp_path / "pairs.jsonl", tmp_path / "out.jsonl"
    lines = ['"alone"', '{"text": "It rains.", "text_pair": "It is wet."}', '{"text": "x"}']
    texts.write_text("\n".join(lines) + "\n")
    command = ["classify", "--url", stub.url, "--file", str(texts), "--jsonl", "--out", str(out)]
    assert cli.main([*command, "--top-k", "2", "--raw-scores", "--no-progress"]) == cli.EXIT_OK
    [(_, body)] = stub.requests
    assert body == {
        "texts": ["alone", {"text": "It rains.", "text_pair": "It is wet."}, "x"],
        "top_k": 2,
        "raw_scores": True,
    }
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["line"] for row in rows] == [1, 2, 3] and all(row["label"] == "a" for row in rows)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("not json", "line 2 is not JSON"),
        ('{"text_pair": "no text"}', "line 2: expected"),
        ('{"text": "a", "text_pair": 3}', 'line 2: "text_pair"'),
        ("", "line 2 is not JSON"),
    ],
)
def test_cli_a_malformed_jsonl_line_stops_the_run_naming_it(
    stub_factory: Callable[..., Stub],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    line: str,
    says: str,
) -> None:
    stub = stub_factory()
    texts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    texts.write_text(f'"first"\n{line}\n"third"\n')
    command = ["classify", "--url", stub.url, "--file", str(texts), "--jsonl", "--out", str(out)]
    assert cli.main([*command, "--no-progress"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert says in err and "stopped after" in err
    assert stub.requests == []


def test_cli_one_pair_with_options(
    stub_factory: Callable[..., Stub], capsys: pytest.CaptureFixture[str]
) -> None:
    stub = stub_factory(answer_with_body)
    command = ["classify", "--url", stub.url, "It rains.", "--text-pair", "It is wet."]
    assert cli.main([*command, "--top-k", "1"]) == cli.EXIT_OK
    assert stub.requests[0][1] == {"text": "It rains.", "text_pair": "It is wet.", "top_k": 1}
    assert json.loads(capsys.readouterr().out)["label"] == "a"


@pytest.mark.parametrize(
    "arguments",
    [
        ["--file", "x.txt", "--text-pair", "b"],
        ["--jsonl", "a"],
        ["--top-k", "0", "a"],
    ],
)
def test_cli_refuses_options_that_cannot_go_together(
    arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["classify", *arguments])
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_cli_one_text_exit_codes_follow_the_error_class(
    stub_factory: Callable[..., Stub], capsys: pytest.CaptureFixture[str]
) -> None:
    """A text the server refuses (the handler's codes, a 413) is that text's failure, exit 1;
    an unknown model or a dead server ends the run, exit 2."""
    internal = {"error": {"code": "internal_error", "message": "m"}, "request_id": "r"}
    replies = {
        "refused": (500, internal),
        "too big": (413, None),
        "no model": (404, {"code": 404, "type": "ModelNotFoundException", "message": "m"}),
    }
    stub = stub_factory(lambda body: replies[body["text"]])
    assert cli.main(["classify", "--url", stub.url, "refused"]) == cli.EXIT_ITEM_FAILED
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "internal_error"
    assert cli.main(["classify", "--url", stub.url, "too big"]) == cli.EXIT_ITEM_FAILED
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "payload_too_large"
    assert cli.main(["classify", "--url", stub.url, "no model"]) == cli.EXIT_FAILED
    assert "model_not_found" in capsys.readouterr().err


def test_read_jsonl_gives_texts_and_pairs_and_marks_bad_bytes() -> None:
    """A string or an object per line; bytes that are not UTF-8 inside a string reach the
    server as lone surrogates (its `invalid_encoding` for that line), as in plain lines."""
    data = b'\xef\xbb\xbf"first"\r\n{"text": "a", "text_pair": "b"}\n{"text": "caf\xe9", "x": 1}\n'
    assert list(cli.read_jsonl(io.BytesIO(data))) == ["first", ("a", "b"), "caf\udce9"]


QUEUE_FULL = {"code": 503, "type": "ServiceUnavailableException", "message": "queue full"}


class FakeClock:
    """Time that passes only when the client sleeps: the retry budget without waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_every_attempt_says_when_it_started_and_how_long_it_waits(
    stub_factory: Callable[..., Stub],
) -> None:
    """The server refuses work for attempts already given up only if they carry these."""
    replies = iter([(503, QUEUE_FULL)])
    stub = stub_factory(lambda body: next(replies, None) or echo(body))
    client, _ = client_for(stub, timeout=2.5)
    before = time.time()
    client.classify("fine")
    starts = []
    for headers, _ in stub.requests:
        assert headers["X-Request-Timeout"] == "2.5"
        assert re.fullmatch(r"t=\d+\.\d{3}", headers["X-Request-Start"])
        starts.append(float(headers["X-Request-Start"][2:]))
    assert len(starts) == 2 and before - 0.01 <= starts[0] <= starts[1] <= time.time() + 0.01


@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_is_honoured_with_jitter_on_top(
    stub_factory: Callable[..., Stub], status: int
) -> None:
    replies = iter([(status, QUEUE_FULL, {"Retry-After": "3"})] * 2)
    stub = stub_factory(lambda body: next(replies, None) or echo(body))
    clock = FakeClock()
    client = Client(stub.url, backoff=0.25, sleep=clock.sleep, clock=clock)
    assert client.classify("fine").label == "label-4"
    assert len(stub.requests) == 3
    assert len(clock.sleeps) == 2 and all(3.0 <= s <= 3.25 for s in clock.sleeps)
    assert clock.sleeps[0] != clock.sleeps[1]


def test_a_retry_after_date_counts_from_now() -> None:
    from email.utils import formatdate

    now = 1_800_000_000.0
    later = formatdate(now + 7, usegmt=True)
    assert client_module.retry_after_seconds(later, now) == pytest.approx(7.0)
    assert client_module.retry_after_seconds(formatdate(now - 60, usegmt=True), now) == 0.0
    assert client_module.retry_after_seconds("soon", now) is None
    assert client_module.retry_after_seconds("nan", now) is None
    assert client_module.retry_after_seconds("1.5", now) == 1.5


def test_the_retry_budget_bounds_a_call_that_keeps_being_refused(
    stub_factory: Callable[..., Stub],
) -> None:
    """No attempt starts after retry_budget: 503s with Retry-After 4 within 10 s are 3 attempts."""
    stub = stub_factory(lambda body: (503, QUEUE_FULL, {"Retry-After": "4"}))
    clock = FakeClock()
    client = Client(
        stub.url, retries=100, backoff=0.01, retry_budget=10, sleep=clock.sleep, clock=clock
    )
    with pytest.raises(exceptions.Unavailable):
        client.classify("x")
    assert len(stub.requests) == 3 and len(clock.sleeps) == 2
    assert clock.now <= 10


def test_a_retry_after_longer_than_the_budget_gives_up_at_once(
    stub_factory: Callable[..., Stub],
) -> None:
    stub = stub_factory(lambda body: (503, QUEUE_FULL, {"Retry-After": "3600"}))
    clock = FakeClock()
    client = Client(stub.url, sleep=clock.sleep, clock=clock)
    with pytest.raises(exceptions.Unavailable):
        client.classify("x")
    assert len(stub.requests) == 1 and clock.sleeps == []


def test_a_deadline_exceeded_answer_is_retried_then_raised_as_its_class(
    stub_factory: Callable[..., Stub],
) -> None:
    expired = {"error": {"code": "deadline_exceeded", "message": "late"}, "request_id": "r"}
    stub = stub_factory(lambda body: (504, expired))
    client, sleeps = client_for(stub, retries=2)
    with pytest.raises(exceptions.DeadlineExceeded) as caught:
        client.classify("x")
    assert caught.value.code == "deadline_exceeded" and caught.value.status == 504
    assert len(stub.requests) == 3 and len(sleeps) == 2


def test_classify_many_under_refusals_answers_every_text_once(
    stub_factory: Callable[..., Stub],
) -> None:
    """A spike, in miniature: every other request is refused; each text is answered once."""
    lock = threading.Lock()
    count = iter(range(10**6))
    answered: list[str] = []

    def reply(body: dict[str, Any]) -> Reply:
        with lock:
            refused = next(count) % 2 == 0
            if not refused:
                answered.extend(body["texts"])
        return (503, QUEUE_FULL, {"Retry-After": "0"}) if refused else echo(body)

    stub = stub_factory(reply)
    client, _ = client_for(stub, retries=50)
    texts = [f"text {i}" * (i % 5 + 1) for i in range(40)]
    results = client.classify_many(texts, chunk_size=4, concurrency=4)
    assert [r.prediction.label if r.prediction else None for r in results] == [
        f"label-{len(t)}" for t in texts
    ]
    assert sorted(answered) == sorted(texts)


def test_the_cli_takes_a_retry_budget() -> None:
    args = cli.parse_args(["classify", "--retry-budget", "5", "x"])
    assert args.retry_budget == 5.0


def test_the_start_stamp_can_be_turned_off_and_the_wait_is_still_stated(
    stub_factory: Callable[..., Stub],
) -> None:
    """No X-Request-Start (this machine's clock) with stamp_deadline=False; X-Request-Timeout
    is relative, depends on no clock, and lets a proxy that stamps the arrival set a deadline."""
    stub = stub_factory()
    client, _ = client_for(stub, stamp_deadline=False, timeout=2.5)
    client.classify("fine")
    ((headers, _),) = stub.requests
    assert "X-Request-Start" not in headers and headers["X-Request-Timeout"] == "2.5"


def test_the_cli_can_leave_out_the_start_stamp(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory()
    assert cli.main(["classify", "--url", stub.url, "x"]) == cli.EXIT_OK
    assert cli.main(["classify", "--url", stub.url, "--no-deadline-stamp", "x"]) == cli.EXIT_OK
    assert cli.main(["explain", "--url", stub.url, "--no-deadline-stamp", "x"]) in (0, 2)
    stamped, unstamped, explained = (headers for headers, _ in stub.requests)
    assert "X-Request-Start" in stamped
    for headers in (unstamped, explained):
        assert "X-Request-Start" not in headers and headers["X-Request-Timeout"] == "70"


def server_ahead_by(seconds: float, holder: list[Stub]) -> Callable[[dict[str, Any]], Reply]:
    """A server whose clock is `seconds` ahead of this one, applying docs/deadlines.md: a start
    stamp plus the stated wait is the deadline; each answer says the wait (`x-wait-time`)."""

    def reply(body: dict[str, Any]) -> Reply:
        headers = holder[0].requests[-1][0]
        now = time.time() + seconds
        start = min(float(headers["X-Request-Start"].removeprefix("t=")), now)
        waited = {"x-wait-time": f"{(now - start) * 1000:.3f}"}
        if now - start > float(headers["X-Request-Timeout"]):
            late = {"error": {"code": "deadline_exceeded", "message": "late"}, "request_id": "r"}
            return 504, late, {**waited, "Retry-After": "1"}
        return (*echo(body), waited)  # type: ignore[return-value]

    return reply


def test_a_clock_behind_the_servers_is_corrected_instead_of_expiring_every_attempt(
    stub_factory: Callable[..., Stub],
) -> None:
    """80 s behind with a 70 s timeout, every stamp was past its deadline on arrival (504 on
    every attempt); the first 504's x-wait-time shows the lag and the next stamp adds it."""
    holder: list[Stub] = []
    stub = stub_factory(server_ahead_by(80.0, holder))
    holder.append(stub)
    client, sleeps = client_for(stub)
    assert client.classify("fine").label == "label-4"
    assert len(stub.requests) == 2 and len(sleeps) == 1
    assert 79.0 < client.clock_lag <= 80.01
    client.classify("again")
    assert len(stub.requests) == 3, "the lag is kept for the client's later calls"


def test_a_clock_in_step_is_not_corrected(stub_factory: Callable[..., Stub]) -> None:
    holder: list[Stub] = []
    stub = stub_factory(server_ahead_by(0.0, holder))
    holder.append(stub)
    client, _ = client_for(stub)
    client.classify_many(["a", "b", "c"], chunk_size=1, concurrency=3)
    assert client.clock_lag < 0.01
    assert client_module.observed_lag("5000", 6.0) is None
    assert client_module.observed_lag("nan", 0.0) is None
    assert client_module.observed_lag(None, 0.0) is None
    assert client_module.observed_lag("80000", 0.5) == pytest.approx(79.5)


EXPLANATION = {
    "words": ["[CLS]", "great", "dull", "[SEP]"],
    "importances": [0.0, 0.8, -0.6, 0.0],
    "delta": 0.001,
    "label": "positive",
    "score": 0.9,
    "truncated": False,
    "n_steps": 10,
    "request_id": "r",
}


def test_explain_posts_to_the_explanations_route_with_its_options(
    stub_factory: Callable[..., Stub],
) -> None:
    stub = stub_factory(lambda body: (200, EXPLANATION))
    client, _ = client_for(stub)
    explanation = client.explain("great dull", target="positive", n_steps=10)
    client.explain("a", "b", target=1)
    assert stub.paths == ["/explanations/bert", "/explanations/bert"]
    assert [body for _, body in stub.requests] == [
        {"text": "great dull", "target": "positive", "n_steps": 10},
        {"text": "a", "text_pair": "b", "target": 1},
    ]
    assert explanation.words == ("[CLS]", "great", "dull", "[SEP]")
    assert explanation.importances == (0.0, 0.8, -0.6, 0.0)
    assert explanation.to_json() == {k: v for k, v in EXPLANATION.items() if k != "request_id"}


@pytest.mark.parametrize("options", [{"n_steps": 0}, {"n_steps": True}, {"target": 1.5}])
def test_explain_refuses_bad_options_before_sending(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Client(f"http://127.0.0.1:{unused_port()}").explain("a", **options)


def test_explain_raises_the_servers_code(stub_factory: Callable[..., Stub]) -> None:
    error = {"error": {"code": "explain_too_long", "message": "too long"}, "request_id": "r"}
    stub = stub_factory(lambda body: (413, error))
    client, _ = client_for(stub)
    with pytest.raises(exceptions.TextTooLong) as caught:
        client.explain("long")
    assert caught.value.code == "explain_too_long"


def test_a_200_that_is_not_an_explanation_is_a_bad_response(
    stub_factory: Callable[..., Stub],
) -> None:
    broken = dict(EXPLANATION, importances=[0.1])
    client, _ = client_for(stub_factory(lambda body: (200, broken)))
    with pytest.raises(exceptions.BadResponse):
        client.explain("great dull")


def test_cli_explain_prints_a_bar_per_token_without_colour_when_piped(
    stub_factory: Callable[..., Stub], capsys: pytest.CaptureFixture[str]
) -> None:
    stub = stub_factory(lambda body: (200, EXPLANATION))
    assert cli.main(["explain", "great dull", "--url", stub.url, "--n-steps", "10"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.startswith("positive 0.900")
    assert [row.split()[0] for row in rows] == ["[CLS]", "great", "dull", "[SEP]"]
    great, dull = rows[1], rows[2]
    assert great.index("|") < great.index("\u2588") and dull.index("\u2588") < dull.index("|")
    assert great.count("\u2588") == 20 and dull.count("\u2588") == 15
    assert "\033[" not in header + "".join(rows)
    assert stub.requests[0][1] == {"text": "great dull", "n_steps": 10}


def test_cli_explain_colours_a_terminal_and_prints_json_when_asked(
    stub_factory: Callable[..., Stub], capsys: pytest.CaptureFixture[str]
) -> None:
    explanation = client_module.Explanation.from_json(EXPLANATION)
    coloured = "\n".join(cli.explanation_lines(explanation, colour=True))
    assert cli.POSITIVE_COLOUR in coloured and cli.NEGATIVE_COLOUR in coloured
    stub = stub_factory(lambda body: (200, EXPLANATION))
    assert cli.main(["explain", "great dull", "--url", stub.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["importances"] == EXPLANATION["importances"]


def test_cli_explain_prints_a_refusal_and_exits_1(
    stub_factory: Callable[..., Stub], capsys: pytest.CaptureFixture[str]
) -> None:
    error = {"error": {"code": "invalid_option", "message": "no such label"}, "request_id": "r"}
    stub = stub_factory(lambda body: (400, error))
    assert cli.main(["explain", "x", "--url", stub.url, "--target", "nope"]) == cli.EXIT_ITEM_FAILED
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "invalid_option"
