"""The NGINX proxy shipped in deploy/k8s/proxy/, run for real where nginx is installed: it
stamps each request's start and wait, keeps its connections to TorchServe open, adds
Retry-After to a 503, and a deadline it stamps reaches the handler."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from bert_serve_server.control import Server

from lab.proxy import nginx_binary, running_proxy
from tests.stub_http import Seen, stub_server

pytestmark = pytest.mark.skipif(
    nginx_binary() is None, reason="nginx is not installed (Debian: apt-get install nginx)"
)
ROUTE_TIMEOUT = "60"


@pytest.fixture
def stub_behind_proxy(tmp_path: Path) -> Iterator[tuple[str, list[Seen]]]:
    """The proxy in front of a stub that records what reaches it; /full answers 503."""
    seen: list[Seen] = []

    def answer(path: str, port: int) -> tuple[int, bytes]:
        return (503, b"queue full") if path == "/full" else (200, b"{}")

    with stub_server(answer, keep_alive=True, seen=seen) as upstream:
        with running_proxy(upstream.removeprefix("http://"), tmp_path / "nginx") as url:
            yield url, seen


def test_each_request_gets_its_start_and_the_route_timeout(
    stub_behind_proxy: tuple[str, list[Seen]],
) -> None:
    url, seen = stub_behind_proxy
    before = time.time()
    requests.post(f"{url}/predictions/bert", data=b"text", timeout=10).raise_for_status()
    requests.post(
        f"{url}/predictions/bert", data=b"text", headers={"X-Request-Timeout": "0.5"}, timeout=10
    ).raise_for_status()
    after = time.time()
    plain, stated = seen[-2:]
    start = float(plain.headers["X-Request-Start"].removeprefix("t="))
    assert before - 0.01 <= start <= after + 0.01
    assert plain.headers["X-Request-Timeout"] == ROUTE_TIMEOUT
    assert stated.headers["X-Request-Timeout"] == "0.5"


def test_connections_to_the_upstream_stay_open(stub_behind_proxy: tuple[str, list[Seen]]) -> None:
    """Ten requests one after another reach the upstream over one connection."""
    url, seen = stub_behind_proxy
    for _ in range(10):
        requests.get(f"{url}/ping", timeout=10).raise_for_status()
    assert len({request.client_port for request in seen[-10:]}) == 1


def test_a_503_gets_retry_after_and_other_answers_do_not(
    stub_behind_proxy: tuple[str, list[Seen]],
) -> None:
    url, _ = stub_behind_proxy
    full = requests.get(f"{url}/full", timeout=10)
    assert full.status_code == 503 and full.headers["Retry-After"] == "1"
    assert "Retry-After" not in requests.get(f"{url}/ping", timeout=10).headers


def test_torchserve_behind_the_proxy(server: Server, tmp_path: Path) -> None:
    """A prediction passes through; a wait the client states and the proxy's start stamp
    reach the handler, which answers 504 unworked once that wait has passed."""
    upstream = server.inference_url.removeprefix("http://")
    with running_proxy(upstream, tmp_path / "nginx") as url:
        route = f"{url}/predictions/bert"
        headers = server.headers() | {"Content-Type": "text/plain"}
        answered = requests.post(route, data="A fine film.", headers=headers, timeout=60)
        assert answered.status_code == 200 and "label" in answered.json()
        late = requests.post(
            route,
            data="A fine film.",
            headers=headers | {"X-Request-Timeout": "0.000001"},
            timeout=60,
        )
        assert late.status_code == 504, late.text
        assert late.json()["error"]["code"] == "deadline_exceeded"
