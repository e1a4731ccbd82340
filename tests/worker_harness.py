"""Drive the handler through TorchServe's own worker code, without the Java frontend.

``ts.service.Service.predict`` is what a TorchServe worker runs for each batch: it builds the
context, calls the handler and encodes the response frame (where batch-wide 503s come from).
Going through it, and decoding the frame it returns, checks the handler against the real
per-item status machinery rather than a mock of it.
"""

from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.service import Service

from handler.bert_handler import MODEL_SUBDIR, BertHandler

ROOT = Path(__file__).resolve().parent.parent
METRICS_CONFIG = ROOT / "config" / "metrics.yaml"


@dataclass(frozen=True)
class Sent:
    """One request as a client sends it: a raw body, its Content-Type, extra headers."""

    body: bytes | None
    content_type: str | None = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()
    fields: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Answer:
    request_id: str
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    """The response headers the handler set, as the frame carries them to the frontend."""


class Worker(NamedTuple):
    """A loaded worker: TorchServe's Service (send it batches with ``predict``) and the
    handler it calls (to patch a stage in a test)."""

    service: Service
    handler: BertHandler


def build_worker(
    workdir: Path,
    model_dir: Path,
    handler_settings: dict[str, Any] | None = None,
    batch_size: int = 16,
    metrics_config: Path = METRICS_CONFIG,
) -> Worker:
    """The one way tests build a worker: ``model_dir`` laid out like an extracted .mar in
    ``workdir``, with config/model-config.yaml's handler settings updated by
    ``handler_settings``, loaded by TorchServe's worker code with the metrics cache it makes
    from ``metrics_config``."""
    return _load_service(
        _mar_folder(workdir, model_dir, handler_settings), batch_size, metrics_config
    )


def _mar_folder(
    tmp_path: Path, model_dir: Path, handler_settings: dict[str, Any] | None = None
) -> Path:
    """A folder laid out like an extracted .mar: model/ and model-config.yaml."""
    root = tmp_path / "mar"
    shutil.copytree(model_dir, root / MODEL_SUBDIR)
    config = yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())
    config["handler"] = {**config["handler"], **(handler_settings or {})}
    (root / "model-config.yaml").write_text(yaml.safe_dump(config))
    return root


def _load_service(
    mar_dir: Path, batch_size: int = 16, metrics_config: Path = METRICS_CONFIG
) -> Worker:
    manifest = {
        "model": {
            "modelName": "bert",
            "modelVersion": "1.0",
            "configFile": "model-config.yaml",
            "handler": "bert_handler.py",
        }
    }
    metrics = MetricsCacheYamlImpl(config_file_path=str(metrics_config))
    metrics.initialize_cache()
    metrics.model_name = "bert"
    handler = BertHandler()
    service = Service(
        "bert", str(mar_dir), manifest, handler.handle, None, batch_size, metrics_cache=metrics
    )
    service.set_cl_socket(None)
    handler.initialize(service.context)
    return Worker(service, handler)


def wire_batch(requests: list[Sent]) -> list[dict[str, Any]]:
    """The batch as the frontend hands it to the worker (decode_input_request=false)."""
    batch = []
    for index, sent in enumerate(requests):
        headers = [(name.encode(), value.encode()) for name, value in sent.headers]
        if sent.content_type is not None:
            headers.append((b"Content-Type", sent.content_type.encode()))
        if sent.fields:
            parameters = [
                {"name": name, "contentType": "", "value": bytearray(value)}
                for name, value in sent.fields
            ]
        elif sent.body is None:
            parameters = []
        else:
            parameters = [
                {
                    "name": "body",
                    "contentType": sent.content_type or "",
                    "value": bytearray(sent.body),
                }
            ]
        batch.append(
            {
                "requestId": f"ts-{index}".encode(),
                "headers": [{"name": name, "value": value} for name, value in headers],
                "parameters": parameters,
            }
        )
    return batch


def decode_frame(frame: bytes) -> tuple[int, list[Answer]]:
    """Parse ts.protocol.otf_message_handler.create_predict_response's bytes."""
    position = 0

    def read_int() -> int:
        nonlocal position
        (value,) = struct.unpack_from("!i", frame, position)
        position += 4
        return int(value)

    def read_bytes() -> bytes:
        nonlocal position
        length = read_int()
        value = frame[position : position + length]
        position += length
        return bytes(value)

    batch_code = read_int()
    read_bytes()
    answers = []
    while True:
        length = read_int()
        if length == -1:
            break
        request_id = frame[position : position + length].decode()
        position += length
        content_type = read_bytes().decode()
        status = read_int()
        read_bytes()
        headers = []
        for _ in range(read_int()):
            name = read_bytes().decode()
            headers.append((name, read_bytes().decode()))
        answers.append(Answer(request_id, status, content_type, read_bytes(), tuple(headers)))
    return batch_code, answers


def predict(service: Service, requests: list[Sent]) -> list[Answer]:
    batch_code, answers = decode_frame(service.predict(wire_batch(requests)))
    assert batch_code == 200, f"the whole batch failed with {batch_code}"
    assert [answer.request_id for answer in answers] == [f"ts-{i}" for i in range(len(requests))]
    return answers
