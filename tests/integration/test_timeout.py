"""What responseTimeout does in TorchServe 0.12, on a real server.

A worker that does not answer a batch within responseTimeout is killed and restarted by the
frontend: that batch's requests answer 5xx (not a hang), and requests after the restart succeed.
A hung batch is simulated by SIGSTOP on the worker process, so no test-only code is needed in
the handler. The default (60 s in config/model-config.yaml) is far above a legitimate full
batch: docs/chaos/README.md gives the measured time of 16 texts at max_length on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import requests
from bert_serve_server.archive import package_variant
from bert_serve_server.control import running

from tests.integration.conftest import stated_settings

RESPONSE_TIMEOUT_S = 4


def test_hung_batch_is_cut_by_response_timeout_and_the_worker_restarts(
    tmp_path, real_model_dir
) -> None:
    store = tmp_path / "store"
    package_variant(store, {"responseTimeout": RESPONSE_TIMEOUT_S}, model_dir=real_model_dir)
    with running(
        {"model_store": str(store)} | stated_settings(), state_dir=tmp_path / "state"
    ) as server:
        hung = None
        try:
            url = server.predict_url
            headers = server.headers() | {"Content-Type": "text/plain"}
            assert requests.post(url, data=b"fine", headers=headers, timeout=30).status_code == 200
            hung = server.worker_pid()
            assert hung is not None
            server.kill_worker(hung, signal.SIGSTOP)
            started = time.monotonic()
            response = requests.post(url, data=b"this batch hangs", headers=headers, timeout=90)
            waited = time.monotonic() - started
            print(
                f"hung batch answered {response.status_code} {response.text!r} after {waited:.1f} s"
            )
            assert 500 <= response.status_code < 600
            assert RESPONSE_TIMEOUT_S - 1 <= waited <= RESPONSE_TIMEOUT_S + 30

            new_pid, _ = server.wait_replaced(hung, {hung}, timeout=120)
            assert new_pid != hung
            assert (
                requests.post(url, data=b"fine again", headers=headers, timeout=30).status_code
                == 200
            )
        finally:
            if hung is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(hung, signal.SIGKILL)  # the process this test stopped
