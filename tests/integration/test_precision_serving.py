"""The fast mode served: a .mar packed with ``precision: bf16`` answers like the fp32 one.

Where this CPU has no native bf16 the worker refuses to start (tests/unit/test_precision.py
checks the message), so there is nothing to serve here.
"""

from __future__ import annotations

import json

import pytest
import requests
from bert_serve_server.archive import package_variant
from bert_serve_server.control import Server, running

from handler.precision import cpu_has_native_bf16
from tests.integration.conftest import stated_settings

TEXTS = [
    "An absolute delight from start to finish.",
    "A tedious, joyless mess.",
    "The hotel room was spotless and the view over the harbour was breathtaking every morning.",
    "Customer support hung up on me twice and never fixed the billing error.",
]


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
def test_bf16_mar_serves_the_fp32_labels_with_close_scores(
    server: Server, tmp_path, real_model_dir
) -> None:
    store = tmp_path / "store"
    package_variant(store, handler_changes={"precision": "bf16"}, model_dir=real_model_dir)
    overrides = {"model_store": str(store)} | stated_settings()
    body = json.dumps({"texts": TEXTS})
    headers = {"Content-Type": "application/json"}
    exact = requests.post(
        server.predict_url, data=body, headers=headers | server.headers(), timeout=60
    )
    with running(overrides, prefix="bf16-") as fast_server:
        fast = requests.post(
            fast_server.predict_url, data=body, headers=headers | fast_server.headers(), timeout=60
        )
        log = fast_server.model_log.read_text()
    assert exact.status_code == fast.status_code == 200
    assert " in bf16:" in log, "the worker did not load the model in bf16"
    for got, expected in zip(fast.json()["results"], exact.json()["results"], strict=True):
        assert got["label"] == expected["label"]
        assert got["scores"] == pytest.approx(expected["scores"], abs=0.1)
