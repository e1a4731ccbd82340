"""One real TorchServe for the whole session, on free 127.0.0.1 ports, always stopped.

Every test under tests/integration/ is marked ``integration`` (``make unit`` leaves them out).
Tests marked ``alone`` run after the others, one at a time with nothing beside them
(scripts/test.sh runs the rest over several processes, each file whole on one); among them,
those marked ``runs_last`` (the container image build) run last: they load the machine for
minutes and write outside the checkout, so whatever they leave behind cannot touch another
test's fixtures.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bert_serve_server.config import BASE_CONFIG, models_entry, read_properties
from bert_serve_server.control import Server, running

from tests.conftest import MAR_PATH, REAL_MODEL_DIR

INTEGRATION_DIR = Path(__file__).resolve().parent


def runs_last(item: pytest.Item) -> bool:
    return item.get_closest_marker("runs_last") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)
    items.sort(key=runs_last)


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


STATED_QUEUE = 100
"""``job_queue_size`` of ``stated_settings``."""
STATED_HEAP = "-Xmx512m"
"""The heap of ``stated_settings``: else the start measures a worker's memory to size it."""


def stated_settings(
    workers: int = 1, batch_size: int = 8, max_batch_delay: int | None = None
) -> dict[str, str]:
    """Config overrides that state every value a start would otherwise measure the model for
    (``batchSize``, the workers, ``job_queue_size``, the heap): for the servers of tests about what a
    server answers, not how it is sized. The measured start is the ``server`` fixture's, and
    the sizing's rules and measurement have tests of their own (tests/unit/test_sizing*.py)."""
    return {
        "models": models_entry(batch_size, max_batch_delay, workers),
        "job_queue_size": str(STATED_QUEUE),
        "vmargs": f"{read_properties(BASE_CONFIG)['vmargs']} {STATED_HEAP}",
    }


POD_SETTINGS = {"maxBatchDelay": 5, "batchSize": 8, "minWorkers": 1, "maxWorkers": 1}
"""Stated, so the start measures nothing (``bert_serve_server.sizing`` is tested on its own)."""
POD_QUEUE = 8
"""job_queue_size: small, so a burst of a few dozen clients fills it (503)."""


@pytest.fixture(scope="session")
def pod_server(
    head_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """TorchServe as in the pod, token authorization off (the proxy in front strips any
    Authorization header), serving two models: ``bert`` (the default model's archive) and
    ``tiny`` version 2 (a tiny 3-label classifier), on free 127.0.0.1 ports, always stopped."""
    from bert_serve_server.archive import package_models
    from bert_serve_server.config import parse_models

    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    root = tmp_path_factory.mktemp("pod")
    store = root / "store"
    store.mkdir()
    for name in (MAR_PATH.name, MAR_PATH.name + ".source"):  # bert.mar as built, not again
        if (MAR_PATH.parent / name).is_file():
            link_or_copy(MAR_PATH.parent / name, store / name)
    specs = parse_models(f"bert={REAL_MODEL_DIR} tiny:2={head_model_dir('single_label')}")
    configured = {"bert": {"1.0": POD_SETTINGS}, "tiny": {"2": POD_SETTINGS}}
    overrides, refused = package_models(specs, store, configured)
    assert overrides is not None and not refused, refused
    fixed = {
        "disable_token_authorization": "true",
        "job_queue_size": str(POD_QUEUE),
        "vmargs": "-Dlog4j.configurationFile=config/log4j2.xml -Xmx512m",
    }
    with running(overrides | fixed, state_dir=root / "state") as instance:
        yield instance


def link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
