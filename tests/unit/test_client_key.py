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


def write_key_file(folder: Path, key: str = "found", address: str | None = None) -> Path:
    """A key file as TorchServe leaves it; with `address`, the state folder's config beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    key_file = folder / "key_file.json"
    key_file.write_text(json.dumps({"inference": {"key": key}, "management": {"key": f"m-{key}"}}))
    if address is not None:
        (folder / "config.properties").write_text(
            f"# the effective config\ninference_address={address}\n"
            "management_address=http://127.0.0.1:8081\n"
        )
    return key_file


@pytest.mark.parametrize(
    "url", ["http://203.0.113.7:8080", "https://bert.example.com", "http://10.0.0.5:8080"]
)
def test_a_found_key_file_is_not_sent_to_another_machine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    url: str,
) -> None:
    """./key_file.json and ./.run/key_file.json are this machine's server's keys: without a
    state beside them, only a loopback URL gets them; the user is told why none was sent."""
    monkeypatch.chdir(tmp_path)
    for name in ("BERT_SERVE_TOKEN", "BERT_SERVE_KEY_FILE", "BERT_SERVE_KEY"):
        monkeypatch.delenv(name, raising=False)
    write_key_file(tmp_path)
    assert cli.resolve_token(cli.parse_args(["classify", "--url", url, "x"])) is None
    assert "not sending the key of key_file.json" in capsys.readouterr().err
    for local in ("http://127.0.0.1:8080", "http://localhost:9000", "http://[::1]:8080"):
        assert cli.resolve_token(cli.parse_args(["classify", "--url", local, "x"])) == "found"


def test_a_named_key_goes_where_the_user_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BERT_SERVE_TOKEN", raising=False)
    key_file = write_key_file(tmp_path / "elsewhere", "named", address="http://127.0.0.1:8080")
    remote = ["classify", "--url", "http://203.0.113.7:8080", "x"]
    assert cli.resolve_token(cli.parse_args([*remote, "--key-file", str(key_file)])) == "named"
    assert cli.resolve_token(cli.parse_args([*remote, "--token", "t"])) == "t"
    monkeypatch.setenv("BERT_SERVE_KEY_FILE", str(key_file))
    assert cli.resolve_token(cli.parse_args(remote)) == "named"


def test_a_found_key_goes_only_to_the_address_its_state_records(
    stub_factory: Callable[..., Stub],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`.run/` records the server its key belongs to (config.properties' inference_address):
    a loopback server on another port does not get it; the one recorded does."""
    monkeypatch.chdir(tmp_path)
    for name in ("BERT_SERVE_TOKEN", "BERT_SERVE_KEY_FILE", "BERT_SERVE_KEY"):
        monkeypatch.delenv(name, raising=False)
    stub = stub_factory()
    write_key_file(tmp_path / ".run", address="http://127.0.0.1:1")
    assert cli.main(["classify", "--url", stub.url, "x"]) == cli.EXIT_OK
    assert "Authorization" not in stub.requests[-1][0]
    assert "it is for http://127.0.0.1:1" in capsys.readouterr().err
    write_key_file(tmp_path / ".run", address=stub.url)
    assert cli.main(["classify", "--url", stub.url, "x"]) == cli.EXIT_OK
    assert stub.requests[-1][0]["Authorization"] == "Bearer found"
    port = stub.url.rsplit(":", 1)[1]
    write_key_file(tmp_path / ".run", address=f"http://0.0.0.0:{port}")
    assert cli.main(["classify", "--url", f"http://localhost:{port}", "x"]) == cli.EXIT_OK
    assert stub.requests[-1][0]["Authorization"] == "Bearer found"


def test_which_urls_a_state_folder_records(tmp_path: Path) -> None:
    key_file = write_key_file(tmp_path, address="http://10.0.0.5:8080")
    belongs = cli.key_file_belongs_to
    assert belongs(key_file, "http://10.0.0.5:8080")
    assert not belongs(key_file, "http://127.0.0.1:8080"), "a loopback URL is another server"
    assert not belongs(key_file, "http://10.0.0.5:8081")
    assert not belongs(key_file, "not a url") and not belongs(key_file, "http://h:port")
    assert belongs(key_file, "http://127.0.0.1:8081", "management")
    (tmp_path / "config.properties").write_text("inference_address: http\\://[::]\\:8080\n")
    assert belongs(key_file, "http://[::1]:8080") and not belongs(key_file, "http://10.0.0.5:8080")


def test_bert_serve_models_sends_a_found_key_to_the_local_management_api_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BERT_SERVE_TOKEN", raising=False)
    monkeypatch.delenv("BERT_SERVE_KEY_FILE", raising=False)
    write_key_file(tmp_path / ".run", address="http://127.0.0.1:8080")
    args = cli.parse_args(["models"])
    assert cli.resolve_token(args, "management", args.management_url) == "m-found"
    args = cli.parse_args(["models", "--management-url", "http://203.0.113.7:8081"])
    assert cli.resolve_token(args, "management", args.management_url) is None
