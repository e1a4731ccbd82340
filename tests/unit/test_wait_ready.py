"""make serve's wait reads the model log: a worker that died loading ends it with its reason."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from bert_serve_server.control import worker_load_error

PREFIX = "2026-11-23T20:31:02,118 [INFO ] W-9000-bert_1.0-stdout MODEL_LOG - "


def log(*lines: str) -> str:
    return "".join(PREFIX + line + "\n" for line in lines)


def test_no_worker_died_means_no_error_yet() -> None:
    assert worker_load_error(log("Torch worker started.", "loaded bert on cpu")) is None


def test_the_handler_reason_is_answered_not_torchserve_rethrow() -> None:
    """A RuntimeError from initialize is logged first ("Failed to load model"), then re-raised
    by TorchServe as "500 - Unknown exception" with the death line: the first is the reason."""
    text = log(
        "Failed to load model bert, exception the model's weights are broken",
        "Traceback (most recent call last):",
        '  File "/ts/model_service_worker.py", line 133, in load_model',
        "RuntimeError: the model's weights are broken",
        "Backend worker process died.",
        "Traceback (most recent call last):",
        "RuntimeError: 500 - Unknown exception",
    )
    assert worker_load_error(text) == "RuntimeError: the model's weights are broken"


def test_a_refused_folder_is_answered_with_its_one_line_reason() -> None:
    text = log(
        "Backend worker process died.",
        "Traceback (most recent call last):",
        "handler.model_check.ModelRefused: /m cannot be served: no tokenizer files (fix: ...)",
    )
    assert worker_load_error(text) == (
        "handler.model_check.ModelRefused: /m cannot be served: no tokenizer files (fix: ...)"
    )
    assert worker_load_error(log("Backend worker process died.")) == (
        "a worker died while loading the model"
    )


def test_each_workers_error_is_told_apart_by_its_model() -> None:
    """With several models, the worker tag (``W-<port>-<name>_<version>``) says whose worker
    died, so that model alone is left out of the next start."""
    from bert_serve_server.control import worker_load_errors

    other = "2026-11-23T20:31:02,118 [INFO ] W-9001-nli_2-stdout MODEL_LOG - "
    text = log("loaded bert on cpu") + "".join(
        other + line + "\n"
        for line in ("Backend worker process died.", "ValueError: the weights are broken")
    )
    assert worker_load_errors(text) == {"nli_2": "ValueError: the weights are broken"}
    assert worker_load_errors(log("loaded bert on cpu")) == {}


class DyingStart:
    """What ``wait_ready`` reads of a start whose one worker died loading: the frontend up,
    the model log in ``folder``, nothing listening for /ping."""

    model_name = "bert"
    inference_url = "http://127.0.0.1:9"

    def __init__(self, folder: Path) -> None:
        self.state_dir, self.model_log = folder, folder / "model_log.log"

    def pid(self) -> int:
        return 1

    def model_names(self) -> list[str]:
        return [self.model_name]

    def versions(self, name: str) -> list[str]:
        return ["1.0"]

    def headers(self) -> dict[str, str]:
        return {}


def test_the_start_waits_for_the_traceback_logged_after_the_death_line(tmp_path: Path) -> None:
    """The worker prints its death line before its traceback, and TorchServe logs each line as
    it relays it: a start that read the log between them reports the cause, not "a worker
    died", once the traceback comes (here 1.5 s later)."""
    from bert_serve_server.control import WorkerLoadFailed, wait_ready

    server = DyingStart(tmp_path)
    server.model_log.write_text(log("Backend worker process died."))
    cause = log("Traceback (most recent call last):", "ValueError: device is 'cuda'")
    later = threading.Timer(1.5, lambda: server.model_log.open("a").write(cause))
    later.start()
    try:
        with pytest.raises(WorkerLoadFailed, match="failed to load: ValueError: device is 'cuda'"):
            wait_ready(server, timeout=60, log_start=0)  # type: ignore[arg-type]
    finally:
        later.cancel()
