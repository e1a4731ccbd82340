"""The container / KServe layout starts with TorchServe and answers.

A real torchserve runs from the layout's own config/config.properties and model-store/,
as the container would, with only its listeners moved to free 127.0.0.1 ports and its
/mnt/models paths pointed at the generated folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from bert_serve_server import layout as deploy_layout
from bert_serve_server.config import configured_model, read_properties
from bert_serve_server.control import Server, running

from tests.conftest import MAR_PATH


@pytest.fixture(scope="module")
def layout_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    root = tmp_path_factory.mktemp("kserve")
    layout = deploy_layout.write_layout(root / "layout")
    config = layout / "config" / "config.properties"
    metrics_name = Path(read_properties(config)["metrics_config"]).name
    overrides = {
        "model_store": str(layout / "model-store"),
        "metrics_config": str(layout / "config" / metrics_name),
    }
    with running(overrides, state_dir=root / "state", base_config=config) as server:
        yield server


def test_ping_answers_without_a_token(layout_server: Server) -> None:
    """Kubelet probes send no token: the layout's TorchServe must answer /ping without one."""
    assert not (layout_server.state_dir / "key_file.json").exists()
    response = requests.get(f"{layout_server.inference_url}/ping", timeout=10)
    assert response.status_code == 200
    assert response.json()["status"] == "Healthy"


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("An absolute delight from start to finish.", "positive"),
        ("A tedious, joyless mess.", "negative"),
    ],
)
def test_predictions_from_the_layout(layout_server: Server, text: str, label: str) -> None:
    response = requests.post(
        layout_server.predict_url,
        data=text.encode(),
        headers={"Content-Type": "text/plain"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["label"] == label
    assert abs(sum(body["scores"].values()) - 1) < 1e-4


def test_kserve_v1_predict_path_answers_instances(layout_server: Server) -> None:
    """TorchServe routes /v1/models/bert:predict to the handler with the body unchanged (no
    service envelope): KServe's v1 {"instances": [...]} gets {"predictions": [...]}, one per
    instance, a bad one failing alone; our {"text": ...} works on that path too."""
    url = f"{layout_server.inference_url}/v1/models/bert:predict"
    instances = [
        "An absolute delight from start to finish.",
        "",
        {"text": "A tedious, joyless mess."},
    ]
    response = requests.post(url, json={"instances": instances}, timeout=60)
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert predictions[0]["label"] == "positive" and predictions[2]["label"] == "negative"
    assert predictions[1]["error"]["code"] == "empty_text"
    ours = requests.post(
        url, json={"text": "An absolute delight from start to finish."}, timeout=60
    )
    assert ours.status_code == 200 and ours.json()["label"] == "positive"


def test_layout_serves_the_configured_batching(layout_server: Server) -> None:
    """The batch settings the server applied are those of config/config.properties, with
    what it leaves out (workers, batch size) sized at start."""
    response = requests.get(f"{layout_server.management_url}/models/bert", timeout=10)
    assert response.status_code == 200
    (model,) = response.json()
    (in_force,) = layout_server.sizing()["in_force"]["models"]["bert"].values()
    assert model["batchSize"] == in_force["batchSize"]
    assert model["maxBatchDelay"] == configured_model()["maxBatchDelay"]
    assert len(model["workers"]) == in_force["minWorkers"]


def test_metrics_endpoint_has_the_autoscaling_counters(
    layout_server: Server,
) -> None:
    """deploy/README.md's autoscaling signals exist under these names on the metrics port."""
    requests.post(
        layout_server.predict_url,
        data=b"fine",
        headers={"Content-Type": "text/plain"},
        timeout=60,
    )
    text = requests.get(f"{layout_server.metrics_url}/metrics", timeout=10).text
    for name in ("ts_inference_requests_total", "ts_queue_latency_microseconds"):
        assert f'{name}{{model_name="bert"' in text, name
