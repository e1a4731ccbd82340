"""make serve's wait reads the model log: a worker that died loading ends it with its reason."""

from __future__ import annotations

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
