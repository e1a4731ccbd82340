"""The fast mode served: the shipped archive (``precision: auto``) and one packed with
``precision: bf16`` answer like fp32 (the session's server, pinned).

Where this CPU has no native bf16, ``auto`` serves fp32 and a bf16 worker refuses to start
(tests/unit/test_precision.py checks the message), so there is no bf16 to serve here.
"""

from __future__ import annotations

import json
import re

import pytest
import requests
from bert_serve_server.archive import package_variant
from bert_serve_server.control import Server, running

from handler.precision import CPU_SPEEDUP, cpu_has_native_bf16
from tests.conftest import MAR_PATH, PRECISION_ENV
from tests.integration.conftest import link_or_copy, stated_settings

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


def test_the_shipped_archive_serves_the_precision_its_start_chose(
    server: Server, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpinned, the start settles ``auto`` (bf16 where this CPU has it, its labels agree and
    it measures at least ``CPU_SPEEDUP`` times fp32's texts/s, else fp32), says why, and its
    workers serve that precision with fp32's labels. The speed-up is measured beside the other
    tests, so which side of the bar it lands on is not asserted: the choice follows the ratio the
    start states (a loaded run measured 1.06x and chose fp32)."""
    monkeypatch.delenv(PRECISION_ENV)
    store = tmp_path / "store"
    store.mkdir()
    link_or_copy(MAR_PATH, store / MAR_PATH.name)
    overrides = {"model_store": str(store)} | stated_settings()
    body = json.dumps({"texts": TEXTS})
    headers = {"Content-Type": "application/json"}
    exact = requests.post(
        server.predict_url, data=body, headers=headers | server.headers(), timeout=60
    )
    with running(overrides, prefix="auto-") as auto_server:
        assert auto_server.in_force is not None
        why = [line for line in auto_server.in_force["why"] if "precision auto" in line]
        (entry,) = auto_server.in_force["models"]["bert"].values()
        chosen = entry["precision"]
        fast = requests.post(
            auto_server.predict_url, data=body, headers=headers | auto_server.headers(), timeout=60
        )
        log = auto_server.model_log.read_text()
    assert len(why) == 1 and f"-> {chosen}: {chosen}:" in why[0]
    if cpu_has_native_bf16():
        ratio = re.search(r"(\d+\.\d+)x fp32's texts/s", why[0])
        assert ratio, f"bf16's labels did not agree with fp32's: {why}"
        if chosen == "bf16":  # the ratio is printed to 2 places: 1.096 reads 1.10, under the bar
            assert float(ratio.group(1)) >= CPU_SPEEDUP, why
        else:
            assert f"under {CPU_SPEEDUP}x" in why[0] and float(ratio.group(1)) <= CPU_SPEEDUP, why
    else:
        assert chosen == "fp32" and "no native bf16" in why[0]
    assert f"precision auto: {chosen}, the start's choice" in log and f" in {chosen}:" in log
    assert exact.status_code == fast.status_code == 200
    for got, expected in zip(fast.json()["results"], exact.json()["results"], strict=True):
        assert got["label"] == expected["label"]
        assert got["scores"] == pytest.approx(expected["scores"], abs=0.1)
