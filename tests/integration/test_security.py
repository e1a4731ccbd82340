"""Routes that can load code stay shut on the server `make serve` starts (its config as
shipped): a real workflow archive and a second .mar are refused with and without the
management key, and the archive's code never runs. docs/security.md lists each route."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest
import requests
from bert_serve_server.config import MODEL_NAME
from bert_serve_server.control import Server, running

from lab.code_routes import WORKFLOW_NAME, WorkflowArchive, build_workflow_archive
from tests.conftest import MAR_PATH

GRPC_MANAGEMENT_SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"
GRPC_REGISTER_URL_FIELD = 9
"""``url`` is field 9 of TorchServe 0.12's ``RegisterModelRequest`` (management.proto)."""


def register_workflow(management_url: str, url: str, headers: dict[str, str]) -> requests.Response:
    """``POST /workflows?url=...`` as TorchServe's docs show it."""
    return requests.post(
        f"{management_url}/workflows",
        params={"url": url, "workflow_name": WORKFLOW_NAME},
        headers=headers,
        timeout=180,
    )


def protobuf_string(field: int, value: str) -> bytes:
    """One length-delimited protobuf field (enough for a one-field request, without stubs)."""
    data = value.encode()
    key = field << 3 | 2
    length = len(data)
    varint = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes([key]) + bytes(varint) + data


def grpc_register_model(target: str, url: str, token: str | None) -> tuple[str, str]:
    """(status code name, details) of gRPC ``RegisterModel(url)`` on the management port."""
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            f"/{GRPC_MANAGEMENT_SERVICE}/RegisterModel",
            request_serializer=lambda request: request,
            response_deserializer=lambda response: response,
        )
        try:
            call(protobuf_string(GRPC_REGISTER_URL_FIELD, url), metadata=metadata, timeout=60)
        except grpc.RpcError as error:
            return error.code().name, str(error.details())
    return "OK", ""


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> WorkflowArchive:
    root = tmp_path_factory.mktemp("workflow")
    return build_workflow_archive(root / "war", root / "markers")


def workflow_urls(archive: WorkflowArchive) -> list[str]:
    """Every way to name the archive: a file URL, a plain path, a bare name in the store."""
    return [archive.path.as_uri(), str(archive.path), archive.path.name]


def served_models(server: Server) -> list[str]:
    response = requests.get(
        f"{server.management_url}/models", headers=server.headers("management"), timeout=30
    )
    response.raise_for_status()
    return sorted(model["modelName"] for model in response.json()["models"])


def test_a_workflow_archive_is_refused_and_its_code_never_runs(
    server: Server, archive: WorkflowArchive
) -> None:
    """POST /workflows, with the management key and without, for each way to name the .war."""
    for url in workflow_urls(archive):
        with_key = register_workflow(server.management_url, url, server.headers("management"))
        assert with_key.status_code == 404, (url, with_key.text)
        without_key = register_workflow(server.management_url, url, {})
        assert without_key.status_code == 400, (url, without_key.text)
    listed = requests.get(
        f"{server.management_url}/workflows", headers=server.headers("management"), timeout=30
    )
    assert listed.json()["workflows"] == []
    called = requests.post(
        f"{server.inference_url}/wfpredict/{WORKFLOW_NAME}",
        data=b"hello",
        headers=server.headers(),
        timeout=30,
    )
    assert called.status_code == 404
    assert served_models(server) == [MODEL_NAME]
    assert archive.ran == []


def test_a_second_mar_is_refused_over_http_and_grpc(server: Server, tmp_path: Path) -> None:
    """POST /models and gRPC RegisterModel, with the management key, for a copy of our own
    .mar outside the store: refused, and the server still serves only its model."""
    other = tmp_path / "other.mar"
    shutil.copy(MAR_PATH, other)
    for url in (other.as_uri(), str(other)):
        response = requests.post(
            f"{server.management_url}/models",
            params={"url": url, "model_name": "other", "initial_workers": 1},
            headers=server.headers("management"),
            timeout=60,
        )
        assert response.status_code == 405, response.text
    grpc_target = f"127.0.0.1:{server.properties['grpc_management_port']}"
    code, details = grpc_register_model(grpc_target, other.as_uri(), server.key("management"))
    assert code == "PERMISSION_DENIED" and details.startswith("Model API disabled"), details
    assert served_models(server) == [MODEL_NAME]


def test_the_same_archive_runs_where_urls_are_allowed(
    archive: WorkflowArchive, tmp_path: Path
) -> None:
    """The control: with TorchServe 0.12's usual settings (any file URL, a workflow store it
    can write) the same archive registers and its code runs, so the refusals above are the
    config's doing and the probe is real."""
    overrides = {"allowed_urls": "file://.*", "workflow_store": str(tmp_path)}
    with running(overrides=overrides) as server:
        try:
            response = register_workflow(
                server.management_url, archive.path.as_uri(), server.headers("management")
            )
            assert response.status_code == 200, response.text
            requests.post(
                f"{server.inference_url}/wfpredict/{WORKFLOW_NAME}",
                data=b"hello",
                headers=server.headers(),
                timeout=60,
            )
            assert archive.ran == ["called", "imported"]
        finally:
            for marker in archive.marker_dir.iterdir():
                marker.unlink()
