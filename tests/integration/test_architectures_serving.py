"""A DeBERTa-v2 classifier served over HTTP, and a start whose workers cannot load ending at once.

DeBERTa-v2 has no sdpa attention in transformers: its worker failed on every start while the
handler loaded every model with sdpa, and the start waited its whole 180 s. Here it is packaged
by the same code as ``make package`` into a model store of its own, served by a real torchserve
on free 127.0.0.1 ports (``attention: auto`` takes eager), and answers what transformers'
pipeline answers, one request at a time and under concurrent traffic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from bert_serve_server import control as torchserve_ctl
from bert_serve_server.archive import package, package_variant

from lab.batchlog import logged_batches
from tests.heads import ITEMS, SERVED_STRIDE, Reference, largest_difference
from tests.integration.conftest import model_log, stated_settings

TOLERANCE = 1e-4
Served = tuple[Reference, torchserve_ctl.Server]


@pytest.fixture(scope="module")
def served(
    architecture_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    model_dir = architecture_dir("deberta-v2")
    root = tmp_path_factory.mktemp("serve-deberta")
    package(model_dir, root / "store")
    overrides = {"model_store": str(root / "store")} | stated_settings()
    with torchserve_ctl.running(overrides, state_dir=root / "state") as server:
        yield Reference(model_dir, stride=SERVED_STRIDE), server


def classify(server: torchserve_ctl.Server, item: str | tuple[str, str]) -> requests.Response:
    document = {"text": item} if isinstance(item, str) else {"text": item[0], "text_pair": item[1]}
    return requests.post(
        server.predict_url,
        data=json.dumps(document),
        headers=server.headers() | {"Content-Type": "application/json"},
        timeout=60,
    )


def test_deberta_answers_like_the_pipeline_alone_and_batched(served: Served) -> None:
    """Each text or pair alone, then all of them three times at once (so batches of mixed
    lengths form), scores what the pipeline scores within 1e-4; the worker logged eager."""
    reference, server = served
    log_offset = model_log(server).stat().st_size
    alone = [classify(server, item) for item in ITEMS]
    with ThreadPoolExecutor(max_workers=3 * len(ITEMS)) as pool:
        together = list(pool.map(lambda item: classify(server, item), ITEMS * 3))
    differences = []
    for item, response in zip(ITEMS * 4, alone + together, strict=True):
        assert response.status_code == 200, response.text
        differences.append(largest_difference(response.json()["scores"], reference(item)))
    print(f"deberta-v2 over HTTP: largest difference from the pipeline {max(differences):.2e}")
    assert max(differences) <= TOLERANCE
    log = model_log(server).read_text()
    assert "attention eager: DebertaV2ForSequenceClassification has no sdpa attention" in log
    sizes, _ = logged_batches(model_log(server), log_offset, 4 * len(ITEMS))
    assert max(sizes) > 1, f"no request was batched: {sizes}"


def test_a_worker_that_cannot_load_ends_the_start_at_once(
    architecture_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """A .mar the package check accepts but whose worker fails at start (device: cuda where
    TorchServe assigns no GPU): the start ends within seconds with the worker's error line,
    not after its 180 s wait, and the server is stopped."""
    store = tmp_path / "store"
    package_variant(store, handler_changes={"device": "cuda"}, model_dir=architecture_dir("bert"))
    overrides = (
        torchserve_ctl.local_port_overrides()
        | {"model_store": str(store), "number_of_gpu": "0"}
        | stated_settings()
    )
    started = time.monotonic()
    with pytest.raises(torchserve_ctl.ServerError) as failed:
        torchserve_ctl.start(tmp_path / "state", overrides=overrides)
    elapsed = time.monotonic() - started
    print(f"a worker that cannot load ended the start after {elapsed:.1f} s: {failed.value}")
    assert "the model's worker failed to load: ValueError: device is 'cuda'" in str(failed.value)
    assert elapsed < 90
    assert torchserve_ctl.server_for(tmp_path / "state").pid() is None
