"""One real TorchServe for the whole session, on free 127.0.0.1 ports, always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torchserve_ctl

from tests.conftest import MAR_PATH


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[torchserve_ctl.Server]:
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    state_dir = tmp_path_factory.mktemp("torchserve")
    instance = torchserve_ctl.start(state_dir, overrides=torchserve_ctl.local_port_overrides())
    try:
        yield instance
    finally:
        torchserve_ctl.stop(instance)


@pytest.fixture(scope="session")
def predict_url(server: torchserve_ctl.Server) -> str:
    return f"{server.inference_url}/predictions/bert"


def model_log(server: torchserve_ctl.Server) -> Path:
    return server.state_dir / "logs" / "model_log.log"
