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
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body: Any
                if self.path == "/ping":
                    status, body = fake.ping, {"status": "Healthy"}
                else:
                    name = self.path.split("/")[2]
                    found = fake.described.get(name)
                    status, body = (200, found) if found is not None else (404, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

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
