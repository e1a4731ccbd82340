"""The settings that keep TorchServe 0.12's code-loading routes shut, in config.properties as
`make serve` uses it and as the image and KServe layout rewrite it (docs/security.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from bert_serve_server import control as server
from bert_serve_server import layout
from bert_serve_server.config import BASE_CONFIG, read_properties

SHUT = {
    "enable_model_api": "false",
    "workflow_store": "/dev/null",
    "install_py_dep_per_model": "false",
    "enable_envvars_config": "false",
}
NEVER_SET = ("model_snapshot", "plugins_path", "use_env_allowed_urls")
URLS = [
    "file:///tmp/wf.war",
    "FILE:///tmp/x.mar",
    "fil:///tmp/x.mar",
    "http://127.0.0.1:9000/wf.war",
    "https://example.com/model.mar",
    "s3://bucket/model.mar",
    "bert.mar",
    "",
]


@pytest.fixture(
    params=["make serve", "image and KServe"],
    ids=["make-serve", "image"],
)
def properties(request: pytest.FixtureRequest) -> dict[str, str]:
    base = read_properties(BASE_CONFIG)
    return base if request.param == "make serve" else layout.container_properties(base)


def test_code_loading_settings(properties: dict[str, str]) -> None:
    for key, value in SHUT.items():
        assert properties.get(key) == value, key
    for key in NEVER_SET:
        assert key not in properties, key
    assert not Path(properties["workflow_store"]).is_dir()


def test_allowed_urls_match_no_url(properties: dict[str, str]) -> None:
    """TorchServe splits allowed_urls on commas and full-matches each pattern, ignoring case
    (ArchiveUtils.validateURL); (?!) means the same in Java's regex as in Python's."""
    patterns = properties["allowed_urls"].split(",")
    for url in URLS:
        assert not any(re.fullmatch(p, url, re.IGNORECASE) for p in patterns), url


def test_management_and_grpc_listen_on_loopback_only(properties: dict[str, str]) -> None:
    assert properties["management_address"].startswith("http://127.0.0.1:")
    assert properties["grpc_management_address"] == "127.0.0.1"
    assert properties["grpc_inference_address"] == "127.0.0.1"


def test_every_start_skips_config_snapshots(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A snapshot in logs/config would re-register whatever the last run had; --ncs ignores them."""
    commands: list[list[str]] = []
    monkeypatch.setattr(server.subprocess, "run", lambda command, **_: commands.append(command))
    instance = server.Server(state_dir=tmp_path, properties=read_properties(BASE_CONFIG))
    server.launch(instance)
    assert commands and "--ncs" in commands[0]
    entrypoint = (layout.ROOT / "deploy" / "entrypoint.sh").read_text()
    assert "torchserve --foreground --ncs" in entrypoint
