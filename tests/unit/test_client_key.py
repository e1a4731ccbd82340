"""The deployment's key (checked by the NGINX proxy) in the client and the command line: sent
as `Authorization: Bearer`, never together with TorchServe's own token, and the proxy's 401
raised as `Unauthorized` saying which key is wanted."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bert_serve import cli, exceptions
from bert_serve.client import Client
from tests.unit.test_client import Reply, Stub, echo

PROXY_401 = {
    "error": {"code": "unauthorized", "message": "a missing or wrong key"},
    "request_id": "0123456789abcdef0123456789abcdef",
}


@pytest.fixture
def stub_factory() -> Iterator[Callable[..., Stub]]:
    started: list[Stub] = []

    def start(reply: Callable[[dict[str, Any]], Reply] = echo) -> Stub:
        started.append(Stub(reply))
        started[-1].thread.start()
        return started[-1]

    yield start
    for stub in started:
        stub.server.shutdown()
        stub.server.server_close()


def test_the_client_sends_the_key_as_a_bearer(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory()
    Client(stub.url, key="deployment-key").classify("good film")
    assert stub.requests[0][0]["Authorization"] == "Bearer deployment-key"


def test_a_key_and_a_token_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        Client("http://127.0.0.1:9", key="k", token="t")


def test_the_proxys_401_is_unauthorized_and_not_retried(stub_factory: Callable[..., Stub]) -> None:
    def refuse(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 401, PROXY_401

    stub = stub_factory(refuse)
    with pytest.raises(exceptions.Unauthorized) as caught:
        Client(stub.url, key="wrong", sleep=lambda s: None).classify("x")
    assert caught.value.status == 401 and "--key" in str(caught.value)
    assert caught.value.request_id == PROXY_401["request_id"]
    assert len(stub.requests) == 1


def test_cli_key_flag_and_environment(
    stub_factory: Callable[..., Stub], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--key, else $BERT_SERVE_KEY; with a key no key file is looked for; a token flag beats
    the key's environment variable; --key with --token is an error."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "key_file.json").write_text(json.dumps({"inference": {"key": "found"}}))
    stub = stub_factory()
    assert cli.main(["classify", "--url", stub.url, "--key", "flag-key", "x"]) == cli.EXIT_OK
    assert stub.requests[-1][0]["Authorization"] == "Bearer flag-key"
    monkeypatch.setenv("BERT_SERVE_KEY", "env-key")
    assert cli.main(["classify", "--url", stub.url, "x"]) == cli.EXIT_OK
    assert stub.requests[-1][0]["Authorization"] == "Bearer env-key"
    assert cli.main(["classify", "--url", stub.url, "--token", "tok", "x"]) == cli.EXIT_OK
    assert stub.requests[-1][0]["Authorization"] == "Bearer tok"
    with pytest.raises(SystemExit):
        cli.parse_args(["classify", "--key", "k", "--token", "t", "x"])


def test_cli_without_the_key_exits_2_naming_it(
    stub_factory: Callable[..., Stub], capsys: pytest.CaptureFixture[str]
) -> None:
    stub = stub_factory(lambda body: (401, PROXY_401))
    assert cli.main(["classify", "--url", stub.url, "--retries", "0", "x"]) == cli.EXIT_FAILED
    assert "BERT_SERVE_KEY" in capsys.readouterr().err
