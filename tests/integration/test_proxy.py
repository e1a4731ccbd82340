"""The NGINX proxy shipped in deploy/k8s/proxy/, run for real where nginx is installed: it
refuses a request without the key (401, JSON) but lets /ping through, and only as /ping (no
raw form of it walks around the key to another route), never forwards the key, stamps each
request's start and wait, keeps its connections to TorchServe open, adds Retry-After to a 503,
and a deadline it stamps reaches the handler."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from bert_serve_server.control import Server

from bert_serve.exceptions import Unauthorized
from tests.nginx_run import nginx_binary, running_proxy
from tests.stub_http import Seen, stub_server

pytestmark = pytest.mark.skipif(
    nginx_binary() is None, reason="nginx is not installed (Debian: apt-get install nginx)"
)
ROUTE_TIMEOUT = "60"
KEY = "k3y-" + "0123456789abcdef" * 3
AUTHORIZED = {"Authorization": f"Bearer {KEY}"}
AROUND_PING = (
    # dot segments: nginx resolves them to /ping, TorchServe routes the segments as they are
    "/predictions/bert/1.0/../../../ping",
    "/predictions/bert/../../ping",
    "/explanations/bert/1.0/../../../ping",
    "/explanations/bert/../../ping",
    "/ping/../predictions/bert",
    "/ping/../explanations/bert",
    "/./ping",
    "/predictions/./../ping",
    # their percent-encodings, and encoded slashes
    "/predictions/bert/1.0/%2e%2e/%2e%2e/%2e%2e/ping",
    "/predictions/bert/1.0/%2E%2e/%2e%2E/%2E%2E/ping",
    "/predictions/bert/1.0/.%2e/%2e./../ping",
    "/explanations/bert/%2e%2e/%2e%2e/ping",
    "/predictions/bert/1.0/..%2f..%2f..%2fping",
    "/predictions/bert/1.0/..%2F..%2F..%2Fping",
    "/predictions%2fbert%2f1.0%2f..%2f..%2f..%2fping",
    "/predictions/bert/1.0/../../../%70ing",
    "/%70ing",
    "/%70%69%6e%67",
    # doubled slashes
    "//ping",
    "///ping",
    "/predictions//bert/../../ping",
    "//predictions/bert/1.0/../../../ping",
    "/predictions/bert/1.0//../../../ping",
    # ";" parameters
    "/ping;x",
    "/predictions/bert;/../../ping",
    "/predictions/bert;x/../../ping",
    "/predictions;/bert/1.0/../../../ping",
    # a query on /ping, and a backslash, a fragment and the absolute form
    "/ping?x=/../predictions/bert",
    "/ping?/../../predictions/bert",
    "/predictions/bert/1.0/../../../ping?x=1",
    "/predictions/bert/1.0/..\\..\\..\\ping",
    "/predictions/bert/1.0/../../../ping#x",
    "http://localhost/predictions/bert/1.0/../../../ping",
    "/ping",
)
"""Request targets sent as they are, without the key: every one either gets no further than
the proxy or reaches the upstream as exactly ``/ping``."""
HEALTHY = b'{"status":"Healthy"}'
"""TorchServe's /ping answer, whitespace aside."""


def send_raw(
    url: str, target: str, body: bytes = b"x", content_type: str = "text/plain"
) -> tuple[int, bytes]:
    """POST ``target`` byte for byte over a socket (requests and urllib would normalize it),
    without a key; the status and body of the answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        head = (
            f"POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        connection.sendall(head.encode("latin-1") + body)
        answer = http.client.HTTPResponse(connection)
        answer.begin()
        return answer.status, answer.read()


@pytest.fixture
def stub_behind_proxy(tmp_path: Path) -> Iterator[tuple[str, list[Seen]]]:
    """The proxy in front of a stub that records what reaches it; /full answers 503."""
    seen: list[Seen] = []

    def answer(path: str, port: int) -> tuple[int, bytes]:
        return (503, b"queue full") if path == "/full" else (200, b"{}")

    with stub_server(answer, keep_alive=True, seen=seen) as upstream:
        with running_proxy(upstream.removeprefix("http://"), tmp_path / "nginx", KEY) as url:
            yield url, seen


def test_each_request_gets_its_start_and_the_route_timeout(
    stub_behind_proxy: tuple[str, list[Seen]],
) -> None:
    url, seen = stub_behind_proxy
    before = time.time()
    route = f"{url}/predictions/bert"
    requests.post(route, data=b"text", headers=AUTHORIZED, timeout=10).raise_for_status()
    requests.post(
        route, data=b"text", headers=AUTHORIZED | {"X-Request-Timeout": "0.5"}, timeout=10
    ).raise_for_status()
    after = time.time()
    plain, stated = seen[-2:]
    start = float(plain.headers["X-Request-Start"].removeprefix("t="))
    assert before - 0.01 <= start <= after + 0.01
    assert plain.headers["X-Request-Timeout"] == ROUTE_TIMEOUT
    assert stated.headers["X-Request-Timeout"] == "0.5"


@pytest.mark.parametrize(
    ("stated", "forwarded"),
    [
        *[(wait, wait) for wait in ("0", "7", "59.999", "60", "60.0", "05")],
        *[(wait, ROUTE_TIMEOUT) for wait in ("61", "60.5", "3600", "1e3", "-1", "soon", "0x10")],
    ],
)
def test_a_clients_wait_passes_up_to_the_proxys_own_and_no_further(
    stub_behind_proxy: tuple[str, list[Seen]], stated: str, forwarded: str
) -> None:
    """The proxy gives up at the route's timeout: a client that says it waits longer, or says
    it in a form the handler does not read, is forwarded as waiting that long, no longer."""
    url, seen = stub_behind_proxy
    requests.post(
        f"{url}/predictions/bert",
        data=b"text",
        headers=AUTHORIZED | {"X-Request-Timeout": stated},
        timeout=10,
    ).raise_for_status()
    assert seen[-1].headers["X-Request-Timeout"] == forwarded


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
    full = requests.get(f"{url}/full", headers=AUTHORIZED, timeout=10)
    assert full.status_code == 503 and full.headers["Retry-After"] == "1"
    assert "Retry-After" not in requests.get(f"{url}/ping", timeout=10).headers
    assert "Retry-After" not in requests.get(f"{url}/other", headers=AUTHORIZED, timeout=10).headers


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Bearer {KEY.upper()}", f"Bearer {KEY}x", KEY, f"Basic {KEY}"],
    ids=["none", "wrong", "other-case", "longer", "no-scheme", "basic"],
)
def test_a_request_without_the_key_is_refused_and_never_forwarded(
    stub_behind_proxy: tuple[str, list[Seen]], authorization: str | None
) -> None:
    """401 with the handler's error shape and a Bearer challenge; nothing reaches TorchServe."""
    url, seen = stub_behind_proxy
    headers = {"Authorization": authorization} if authorization else {}
    before = len(seen)
    refused = requests.post(f"{url}/predictions/bert", data=b"text", headers=headers, timeout=10)
    assert refused.status_code == 401, refused.text
    assert refused.headers["Content-Type"] == "application/json"
    assert refused.headers["WWW-Authenticate"].startswith("Bearer ")
    body = refused.json()
    assert body["error"]["code"] == Unauthorized.code and body["error"]["message"]
    assert len(body["request_id"]) == 32
    assert len(seen) == before


def test_the_right_key_passes_and_torchserve_never_sees_it(
    stub_behind_proxy: tuple[str, list[Seen]],
) -> None:
    url, seen = stub_behind_proxy
    answered = requests.post(f"{url}/predictions/bert", data=b"t", headers=AUTHORIZED, timeout=10)
    assert answered.status_code == 200
    forwarded = seen[-1]
    assert forwarded.path == "/predictions/bert"
    assert "authorization" not in {name.lower() for name in forwarded.headers}
    assert not [value for value in forwarded.headers.values() if KEY in value]


@pytest.mark.parametrize("credentials", [f"bearer {KEY}", f"BEARER {KEY}", f"Bearer  {KEY}"])
def test_the_scheme_is_read_in_any_case(
    stub_behind_proxy: tuple[str, list[Seen]], credentials: str
) -> None:
    """RFC 7235: the auth scheme is case-insensitive, and one or more spaces follow it."""
    url, _ = stub_behind_proxy
    answered = requests.post(
        f"{url}/predictions/bert", data=b"t", headers={"Authorization": credentials}, timeout=10
    )
    assert answered.status_code == 200


def test_probes_pass_without_a_key(stub_behind_proxy: tuple[str, list[Seen]]) -> None:
    """/ping (kubelet, load balancers) needs no key, and a key sent there is not forwarded."""
    url, seen = stub_behind_proxy
    assert requests.get(f"{url}/ping", timeout=10).status_code == 200
    assert requests.get(f"{url}/ping", headers=AUTHORIZED, timeout=10).status_code == 200
    assert seen[-1].path == "/ping" and "Authorization" not in seen[-1].headers
    assert requests.get(f"{url}/pingx", timeout=10).status_code == 401
    assert requests.get(f"{url}/ping/x", timeout=10).status_code == 401


def test_no_raw_form_of_ping_reaches_another_route(
    stub_behind_proxy: tuple[str, list[Seen]],
) -> None:
    """nginx picks the keyless /ping by the path it has normalized; the upstream gets exactly
    /ping, never the path the client sent, which TorchServe would route as it stands."""
    url, seen = stub_behind_proxy
    leaked = {}
    for target in AROUND_PING:
        before = len(seen)
        status, _ = send_raw(url, target)
        forwarded = [request.path for request in seen[before:]]
        if forwarded not in ([], ["/ping"]):
            leaked[target] = (status, forwarded)
    assert leaked == {}, f"reached the upstream as another path than /ping: {sorted(leaked)}"
    assert send_raw(url, "/ping")[0] == 200 and seen[-1].path == "/ping"


@pytest.mark.parametrize("key", ["", "short-key", "k" * 31 + "!"], ids=["empty", "short", "bad"])
def test_a_proxy_without_a_usable_key_serves_nothing_but_ping(tmp_path: Path, key: str) -> None:
    """An empty, short or odd key (a Secret set wrong) answers 500 saying so, even to a request
    that sends that very key; the probe still passes."""
    with stub_server(lambda path, port: (200, b"{}")) as upstream:
        with running_proxy(upstream.removeprefix("http://"), tmp_path / "nginx", key) as url:
            refused = requests.get(
                f"{url}/predictions/bert", headers={"Authorization": f"Bearer {key}"}, timeout=10
            )
            assert refused.status_code == 500
            assert "no usable key" in refused.json()["error"]["message"]
            assert requests.get(f"{url}/ping", timeout=10).status_code == 200


def test_a_key_left_unreplaced_stops_nginx_at_start(tmp_path: Path) -> None:
    """Were the entrypoint's substitution skipped, the placeholder would be the key: nginx
    refuses the file instead."""
    with pytest.raises(RuntimeError, match="(?i)unknown .BERT_SERVE_PROXY_KEY. variable"):
        with running_proxy("127.0.0.1:9", tmp_path / "nginx", None):
            pass


def test_torchserve_behind_the_proxy(pod_server: Server, tmp_path: Path) -> None:
    """A prediction passes through with the key; a wait the client states and the proxy's
    start stamp reach the handler, which answers 504 unworked once that wait has passed."""
    upstream = pod_server.inference_url.removeprefix("http://")
    with running_proxy(upstream, tmp_path / "nginx", KEY) as url:
        assert requests.get(f"{url}/ping", timeout=10).json()["status"] == "Healthy"
        route = f"{url}/predictions/bert"
        refused = requests.post(route, data="A fine film.", timeout=60)
        assert refused.status_code == 401
        headers = AUTHORIZED | {"Content-Type": "text/plain"}
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


def test_torchserve_serves_no_prediction_around_the_key(pod_server: Server, tmp_path: Path) -> None:
    """TorchServe with its token auth off, as in the pod, behind the proxy: no raw form of
    /ping without the key gets a prediction or an explanation, and /ping answers Healthy."""
    upstream = pod_server.inference_url.removeprefix("http://")
    text = b"A fine film."
    with running_proxy(upstream, tmp_path / "nginx", KEY) as url:
        served = {}
        for target in AROUND_PING:
            status, body = send_raw(url, target, text)
            if status == 200 and b"".join(body.split()) != HEALTHY:
                served[target] = body[:120]
        assert served == {}, f"answered other than /ping's Healthy, with no key: {sorted(served)}"
        status, body = send_raw(url, "/ping", text)
        assert status == 200 and json.loads(body)["status"] == "Healthy"
        json_body = json.dumps({"text": "A fine film."}).encode()
        for route in ("/predictions/bert", "/explanations/bert"):
            assert send_raw(url, route, json_body, "application/json")[0] == 401, route
