"""What responseTimeout does in TorchServe 0.12, on a real server.

A worker that does not answer a batch within responseTimeout is killed and restarted by the
frontend: that batch's requests answer 5xx (not a hang), and requests after the restart succeed.
A hung batch is simulated by SIGSTOP on the worker process, so no test-only code is needed in
the handler. The default (60 s in config/model-config.yaml) is far above a legitimate full
batch: docs/reliability.md gives the measured time of 16 texts at max_length on 2 CPU cores.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from bert_serve.harness.archive import package_variant
from bert_serve.harness.config import local_port_overrides, models_entry
from bert_serve.harness.server import start, stop

RESPONSE_TIMEOUT_S = 4


def test_hung_batch_is_cut_by_response_timeout_and_the_worker_restarts(
    tmp_path, real_model_dir
) -> None:
    store = tmp_path / "store"
    package_variant(store, {"responseTimeout": RESPONSE_TIMEOUT_S}, model_dir=real_model_dir)
    one_worker = {"model_store": str(store), "models": models_entry(workers=1)}
    overrides = local_port_overrides() | one_worker
    server = start(tmp_path / "state", overrides=overrides)
    hung = None
    try:
        url = server.predict_url
        headers = server.headers() | {"Content-Type": "text/plain"}
        assert requests.post(url, data=b"fine", headers=headers, timeout=30).status_code == 200
        hung = server.worker_pid()
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
            pid = server.worker_pid()
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
        stop(server)
