"""One real TorchServe for the whole session, on free 127.0.0.1 ports, always stopped.

Every test under tests/integration/ is marked ``integration`` (``make unit`` leaves them out).
Tests marked ``runs_last`` (the container image build) run after all others: they load the
machine for minutes and write outside the checkout, so whatever they leave behind cannot touch
another test's fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bert_serve_server.control import Server, running

from tests.conftest import MAR_PATH

INTEGRATION_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("runs_last") is not None)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    with running(state_dir=tmp_path_factory.mktemp("torchserve")) as instance:
        yield instance


@pytest.fixture(scope="session")
def predict_url(server: Server) -> str:
    return server.predict_url


def model_log(server: Server) -> Path:
    return server.model_log
