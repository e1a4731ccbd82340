"""What responseTimeout does in TorchServe 0.12, on a real server.

A worker that does not answer a batch within responseTimeout is killed and restarted by the
frontend: that batch's requests answer 5xx (not a hang), and requests after the restart succeed.
A hung batch is simulated by SIGSTOP on the worker process, so no test-only code is needed in
the handler. The default (60 s in config/model-config.yaml) is far above a legitimate full
batch: the README gives the measured time of 16 texts at max_length on 2 CPU cores.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests
import torchserve_ctl
import yaml
from bench import models_entry
from package import MODEL_CONFIG, package

RESPONSE_TIMEOUT_S = 4


def worker_pid(server: torchserve_ctl.Server) -> int | None:
    response = requests.get(
        f"{server.management_url}/models/bert", headers=server.headers("management"), timeout=10
    )
    workers = response.json()[0]["workers"]
    ready = [w for w in workers if w["status"] == "READY"]
    return int(ready[0]["pid"]) if ready else None


def test_hung_batch_is_cut_by_response_timeout_and_the_worker_restarts(
    tmp_path, real_model_dir
) -> None:
    config = yaml.safe_load(MODEL_CONFIG.read_text()) | {"responseTimeout": RESPONSE_TIMEOUT_S}
    (tmp_path / "model-config.yaml").write_text(yaml.safe_dump(config))
    store = tmp_path / "store"
    package(real_model_dir, store, tmp_path / "model-config.yaml")
    one_worker = {"model_store": str(store), "models": models_entry(workers=1)}
    overrides = torchserve_ctl.local_port_overrides() | one_worker
    server = torchserve_ctl.start(tmp_path / "state", overrides=overrides)
    hung = None
    try:
        url = f"{server.inference_url}/predictions/bert"
        headers = server.headers() | {"Content-Type": "text/plain"}
        assert requests.post(url, data=b"fine", headers=headers, timeout=30).status_code == 200
        hung = worker_pid(server)
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)
        started = time.monotonic()
        response = requests.post(url, data=b"this batch hangs", headers=headers, timeout=90)
        waited = time.monotonic() - started
        print(f"hung batch answered {response.status_code} {response.text!r} after {waited:.1f} s")
        assert 500 <= response.status_code < 600
        assert RESPONSE_TIMEOUT_S - 1 <= waited <= RESPONSE_TIMEOUT_S + 30

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pid = worker_pid(server)
            if pid is not None and pid != hung:
                break
            time.sleep(1)
        else:
            pytest.fail("no new READY worker within 120 s of the timeout")
        assert (
            requests.post(url, data=b"fine again", headers=headers, timeout=30).status_code == 200
        )
    finally:
        if hung is not None:
            try:
                os.kill(hung, signal.SIGKILL)
            except ProcessLookupError:
                pass
        torchserve_ctl.stop(server)
