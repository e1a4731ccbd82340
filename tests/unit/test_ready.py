"""server/bert_serve_server/ready.py, the pod's probes and drain, asked of a fake TorchServe
(management and metrics APIs) on a free port: ready while each served model version has a READY
worker, started when every worker is READY; drained when every accepted request is answered."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from bert_serve_server import ready
from bert_serve_server.config import properties_text, read_properties


class FakeTorchServe:
    """Answers GET /models/NAME/all with ``described[NAME]`` and /ping with ``ping``."""

    def __init__(self) -> None:
        self.described: dict[str, list[dict[str, Any]]] = {}
        self.ping = 200
        self.pending = 0
        self.posts = 0
        self.accepted = {"bert": 0.0, "nli": 0.0}
        self.answered = {"bert": 0.0, "nli": 0.0}
        self.scrapes = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body: Any
                if self.path == "/ping":
                    status, body = fake.ping, {"status": "Healthy"}
                elif self.path == "/metrics":
                    fake.scrapes += 1
                    data = fake.metrics().encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                else:
                    name = self.path.split("/")[2]
                    found = fake.described.get(name)
                    for entry in found or []:
                        entry["jobQueueStatus"] = {"pendingRequests": fake.pending}
                    status, body = (200, found) if found is not None else (404, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                fake.posts += 1
                fake.pending = max(0, fake.pending - 1)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"

    def metrics(self) -> str:
        """TorchServe's metrics API's shapes: the frontend's counter of accepted requests (by
        model and the version asked for) and the handler's of answered ones."""
        lines = []
        for name, count in self.accepted.items():
            lines.append(
                f'ts_inference_requests_total{{model_name="{name}",model_version="default",'
                f'hostname="pod",}} {count}'
            )
        for name, count in self.answered.items():
            lines.append(
                f'BatchItems{{ModelName="{name}",Level="Model",Hostname="pod",ModelVersion="1",}} {count}'
            )
        return "# TYPE BatchItems counter\n" + "\n".join(lines) + "\n"


@pytest.fixture
def torchserve() -> Iterator[FakeTorchServe]:
    fake = FakeTorchServe()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def config(tmp_path: Path, torchserve: FakeTorchServe) -> Path:
    path = tmp_path / "config.properties"
    models = {"bert": {"1.0": {"minWorkers": 2}}, "nli": {"1": {}, "2": {}}}
    address = torchserve.address.replace("127.0.0.1", "0.0.0.0")
    path.write_text(
        properties_text(
            {
                "inference_address": address,
                "management_address": torchserve.address,
                "metrics_address": address,
                "models": json.dumps(models),
            }
        )
    )
    return path


def version(number: str, *states: str) -> dict[str, Any]:
    return {
        "modelVersion": number,
        "workers": [{"id": i, "status": s} for i, s in enumerate(states)],
    }


def test_ready_while_each_version_has_a_ready_worker_started_when_all_are(
    tmp_path: Path, torchserve: FakeTorchServe, capsys: pytest.CaptureFixture[str]
) -> None:
    """Readiness: one READY worker per version keeps the pod serving while another restarts;
    the startup probe (--startup) waits for every worker, as the start loads them all."""
    path = config(tmp_path, torchserve)
    torchserve.described = {
        "bert": [version("1.0", "READY", "UNLOADED")],
        "nli": [version("1", "READY"), version("2", "READY")],
    }
    assert ready.main(["--config", str(path)]) == 0
    assert ready.main(["--startup", "--config", str(path)]) == 1
    assert "bert 1.0: workers ['READY', 'UNLOADED']" in capsys.readouterr().err
    torchserve.described["bert"] = [version("1.0", "UNLOADED", "STOPPED")]
    assert ready.main(["--config", str(path)]) == 1
    assert "bert 1.0: workers ['UNLOADED', 'STOPPED']" in capsys.readouterr().err
    torchserve.described["bert"] = [version("1.0", "READY", "READY")]
    torchserve.described["nli"] = [version("1", "READY")]
    assert ready.main(["--config", str(path)]) == 1
    assert "nli 2: no workers" in capsys.readouterr().err
    torchserve.described["nli"].append(version("2", "READY"))
    assert ready.main(["--config", str(path)]) == 0
    assert ready.main(["--startup", "--config", str(path)]) == 0


def test_not_ready_while_torchserve_does_not_answer(tmp_path: Path) -> None:
    path = tmp_path / "config.properties"
    path.write_text('management_address=http://127.0.0.1:9\nmodels={"bert": {"1.0": {}}}\n')
    assert ready.not_ready(read_properties(path))
    assert ready.main(["--config", str(tmp_path / "absent.properties")]) == 1


def test_live_asks_ping_on_the_inference_address(
    tmp_path: Path, torchserve: FakeTorchServe
) -> None:
    path = config(tmp_path, torchserve)
    assert ready.main(["--live", "--config", str(path)]) == 0
    torchserve.ping = 500
    assert ready.main(["--live", "--config", str(path)]) == 1


def test_the_sized_config_is_where_the_entrypoint_writes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.conftest import ROOT

    monkeypatch.setenv("HOME", "/home/model-server")
    assert 'sized="$HOME/config.properties"' in (ROOT / "deploy" / "entrypoint.sh").read_text()
    assert ready.sized_config() == Path("/home/model-server/config.properties")


def answer_later(torchserve: FakeTorchServe, after_s: float) -> threading.Thread:
    """Another worker's batch: its requests answered ``after_s`` from now."""

    def finish() -> None:
        time.sleep(after_s)
        torchserve.answered = dict(torchserve.accepted)

    thread = threading.Thread(target=finish, daemon=True)
    thread.start()
    return thread


def test_drain_waits_for_batches_running_in_other_workers_and_marks_the_pod_not_ready(
    tmp_path: Path, torchserve: FakeTorchServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing queued (pendingRequests 0) while 3 requests are in a batch of another worker:
    the drain ends only once they are answered, and readiness says not ready from its start."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = config(tmp_path, torchserve)
    torchserve.described = {
        "bert": [version("1.0", "READY", "READY")],
        "nli": [version("1", "READY"), version("2", "READY")],
    }
    assert ready.main(["--config", str(path)]) == 0
    torchserve.accepted = {"bert": 10.0, "nli": 4.0}
    torchserve.answered = {"bert": 7.0, "nli": 4.0}
    started = time.monotonic()
    answer_later(torchserve, 0.6)
    assert ready.main(["--drain", "--config", str(path)]) == 0
    assert time.monotonic() - started >= 0.6
    assert ready.main(["--config", str(path)]) == 1, "draining: not ready"


def test_drain_first_waits_while_the_proxy_still_accepts(
    tmp_path: Path, torchserve: FakeTorchServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--wait-port: the proxy keeps accepting for its stop delay; what it takes then reaches
    TorchServe, so the count is read only once nothing listens there any more."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = config(tmp_path, torchserve)
    proxy = socket.create_server(("127.0.0.1", 0))
    port = proxy.getsockname()[1]
    threading.Timer(0.5, proxy.close).start()
    started = time.monotonic()
    assert ready.main(["--drain", "--wait-port", str(port), "--config", str(path)]) == 0
    assert time.monotonic() - started >= 0.5
    held = socket.create_server(("127.0.0.1", 0))
    try:
        code = ready.main(
            [
                "--drain",
                "--wait-port",
                str(held.getsockname()[1]),
                "--deadline",
                "0.3",
                "--config",
                str(path),
            ]
        )
        assert code == 1
    finally:
        held.close()


def test_drain_backs_off_and_gives_up_at_its_deadline(
    tmp_path: Path,
    torchserve: FakeTorchServe,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A request never answered (its worker died): the drain polls with a doubling pause, not
    in a tight loop, and ends at its deadline saying what is left."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = config(tmp_path, torchserve)
    torchserve.accepted["bert"] = 1.0
    started = time.monotonic()
    assert ready.main(["--drain", "--deadline", "2", "--config", str(path)]) == 1
    assert 1.0 <= time.monotonic() - started <= 3.0
    assert "{'bert': 1}" in capsys.readouterr().err
    assert 3 <= torchserve.scrapes <= 10, torchserve.scrapes


def test_drain_of_a_gone_frontend_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "config.properties"
    path.write_text('metrics_address=http://127.0.0.1:9\nmodels={"bert": {"1.0": {}}}\n')
    started = time.monotonic()
    assert ready.main(["--drain", "--config", str(path)]) == 1
    assert time.monotonic() - started < 5


TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000   101        0 1 1
   1: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000   101        0 2 1
   2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000 10001        0 3 1
   3: 0100007F:1F40 0100007F:D432 06 00000000:00000000 00:00000000 00000000   101        0 4 1
"""


def test_established_on_counts_the_connected_sockets_of_a_local_port() -> None:
    """/proc/net/tcp's shape: the proxy (8000 = 0x1F40) listening (0A), one client connected
    (01), one in TIME_WAIT (06); TorchServe's 8080 (0x1F90) with one."""
    assert ready.established_on(8000, TCP) == 1
    assert ready.established_on(8080, TCP) == 1
    assert ready.established_on(9000, TCP) == 0
    assert ready.established_on(8000, "garbage\n") == 0
