"""server/bert_serve_server/ready.py, the pod's probe: ready only when every worker of every
model version the config serves is READY, asked of a fake management API on a free port."""

from __future__ import annotations

import json
import threading
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
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body: Any
                if self.path == "/ping":
                    status, body = fake.ping, {"status": "Healthy"}
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


def test_ready_only_when_every_worker_of_every_version_is_ready(
    tmp_path: Path, torchserve: FakeTorchServe, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, torchserve)
    torchserve.described = {
        "bert": [version("1.0", "READY", "UNLOADED")],
        "nli": [version("1", "READY"), version("2", "READY")],
    }
    assert ready.main(["--config", str(path)]) == 1
    assert "bert 1.0: workers ['READY', 'UNLOADED']" in capsys.readouterr().err
    torchserve.described["bert"] = [version("1.0", "READY", "READY")]
    torchserve.described["nli"] = [version("1", "READY")]
    assert ready.main(["--config", str(path)]) == 1
    assert "nli 2: no workers" in capsys.readouterr().err
    torchserve.described["nli"].append(version("2", "READY"))
    assert ready.main(["--config", str(path)]) == 0


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


def test_drain_waits_until_nothing_is_queued_and_marks_the_pod_not_ready(
    tmp_path: Path, torchserve: FakeTorchServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round sends every model a request behind the queue; it ends once the management
    API counts nothing pending, and readiness says not ready from then on."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = config(tmp_path, torchserve)
    torchserve.described = {
        "bert": [version("1.0", "READY", "READY")],
        "nli": [version("1", "READY"), version("2", "READY")],
    }
    assert ready.main(["--config", str(path)]) == 0
    torchserve.pending = 5
    assert ready.main(["--drain", "--config", str(path)]) == 0
    assert torchserve.pending == 0 and torchserve.posts >= 5
    assert ready.main(["--config", str(path)]) == 1, "draining: not ready"


def test_drain_gives_up_at_its_deadline(
    tmp_path: Path, torchserve: FakeTorchServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = config(tmp_path, torchserve)
    torchserve.described = {"bert": [version("1.0", "READY")], "nli": []}
    torchserve.pending = 10**9
    assert ready.main(["--drain", "--deadline", "0.5", "--config", str(path)]) == 1
