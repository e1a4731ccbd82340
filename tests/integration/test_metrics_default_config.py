"""Served with a config.properties without ``metrics_config`` (a user's own, a platform's).

TorchServe then gives the workers its own metrics.yaml, which declares none of the
handler's counters. The tiny BERT, packaged into a store of its own, must answer as the
transformers pipeline does, each worker must log one warning at start naming the file, and
no batch may log a MetricsCacheKeyError (before, each one did, with a stack trace).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from bert_serve_server.archive import package
from bert_serve_server.config import BASE_CONFIG
from bert_serve_server.control import Server, running

from tests.heads import SERVED_STRIDE, Reference, largest_difference

TEXTS = [
    "Fine.",
    "The service was slow but the food made up for it.",
    "Not for me.",
    "Brilliant! " * 80,
]
WARNING = re.compile(r" (W-\d+)-\S+ .*does not declare (\d+) of the handler's")


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("default-metrics")
    package(tiny_model_dir, root / "store")
    config = root / "config.properties"
    config.write_text(
        "".join(
            line + "\n"
            for line in BASE_CONFIG.read_text().splitlines()
            if not line.startswith("metrics_config=")
        )
    )
    overrides = {"model_store": str(root / "store")}
    with running(overrides, state_dir=root / "state", base_config=config) as server:
        yield server


def post(server: Server, text: str) -> requests.Response:
    headers = server.headers() | {"Content-Type": "text/plain"}
    return requests.post(server.predict_url, data=text.encode(), headers=headers, timeout=60)


def test_answers_are_right_and_each_worker_warns_once(served: Server, tiny_model_dir) -> None:
    assert "metrics_config" not in served.properties
    reference = Reference(tiny_model_dir, stride=SERVED_STRIDE)
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda text: post(served, text), TEXTS * 6))
    for text, response in zip(TEXTS * 6, responses, strict=True):
        assert response.status_code == 200, response.text
        assert largest_difference(response.json()["scores"], reference(text)) < 1e-4
    empty = post(served, "  ")
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_text"
    logs = served.state_dir / "logs"
    text = "".join(path.read_text(errors="replace") for path in logs.glob("*.log"))
    assert "MetricsCacheKeyError" not in text
    assert "could not emit" not in text
    # counted in the workers' own log: their lines also reach TorchServe's stdout (its log here)
    warnings = Counter(match[1] for match in WARNING.finditer(served.model_log.read_text()))
    assert warnings == {"W-9000": 1, "W-9001": 1}, warnings
    assert "ts/configs/metrics.yaml" in text
    assert "[METRICS]Batches" not in text
