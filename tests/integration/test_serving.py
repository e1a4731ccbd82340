"""HTTP against a real torchserve with the packaged .mar."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
import requests
from bert_serve_server import probe, rules
from bert_serve_server.config import configured_model
from bert_serve_server.sizing import archive_limits

from lab.batchlog import logged_batches
from tests.conftest import MAR_PATH, ROOT
from tests.integration.conftest import model_log

FORM = "application/x-www-form-urlencoded"


def post(
    server, url: str, data: bytes | str, content_type: str | None = "text/plain", **headers: str
):
    all_headers = {**server.headers(), **headers}
    if content_type is not None:
        all_headers["Content-Type"] = content_type
    return requests.post(url, data=data, headers=all_headers, timeout=60)


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("An absolute delight from start to finish.", "positive"),
        ("A tedious, joyless mess.", "negative"),
    ],
)
def test_valid_text_gets_its_label(server, predict_url, text: str, label: str) -> None:
    response = post(server, predict_url, text.encode())
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["label"] == label and body["truncated"] is False
    assert sum(body["scores"].values()) == pytest.approx(1.0, abs=1e-5)


def test_json_and_form_field_forms_work(server, predict_url) -> None:
    """JSON {"text": ...} and a urlencoded text= field are accepted like a raw body."""
    as_json = post(
        server, predict_url, json.dumps({"text": "A tedious, joyless mess."}), "application/json"
    )
    as_form = post(server, predict_url, "text=A+tedious%2C+joyless+mess.", FORM)
    assert as_json.status_code == as_form.status_code == 200
    assert as_json.json()["scores"] == pytest.approx(as_form.json()["scores"], abs=1e-6)


@pytest.mark.parametrize(
    ("data", "content_type", "status", "code"),
    [
        (b"", "text/plain", 400, "empty_text"),
        (b" \n\t ", "text/plain", 400, "empty_text"),
        (b'{"txt": "hi"}', "application/json", 400, "missing_field"),
        (b'{"text": 42}', "application/json", 400, "invalid_type"),
        (b'["a"]', "application/json", 400, "invalid_type"),
        (b'{"text": "unterminated', "application/json", 400, "invalid_json"),
        (b"[" * 50_000, "application/json", 400, "invalid_json"),
        (b"caf\xc3\xa9 \xff\xfe", "text/plain", 400, "invalid_encoding"),
        (b"\xc3\x28", None, 400, "invalid_encoding"),
        (b"a" * 10_001, "text/plain", 413, "payload_too_large"),
        (b"great film", FORM, 400, "missing_field"),
    ],
)
def test_bad_input_gets_its_own_4xx_and_json_error(
    server, predict_url, data, content_type, status, code
) -> None:
    response = post(server, predict_url, data, content_type, **{"X-Request-ID": "bad-input-1"})
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert response.json()["request_id"] == "bad-input-1"


def test_a_long_text_is_classified_whole_as_windows(server, predict_url) -> None:
    """A text of max_chars answers 200 with its windows, and "windows": false truncates it; a
    list of 64 such texts answers 413 with its reason and the worker answers on."""
    opening = "We arrived on a Tuesday and the room faced the courtyard. " * 60
    text = (opening + "A wonderful and moving film, I loved every minute. " * 200)[:10_000]
    body = post(server, predict_url, json.dumps({"text": text}).encode(), "application/json")
    answer = body.json()
    assert body.status_code == 200 and answer["truncated"] is False and answer["windows"] > 10
    assert answer["label"] == "positive"
    cut = {"text": text, "windows": False}
    answer = post(server, predict_url, json.dumps(cut).encode(), "application/json").json()
    assert answer["truncated"] is True and "windows" not in answer
    hostile = json.dumps({"texts": [text] * 64}).encode()
    refused = post(server, predict_url, hostile, "application/json")
    assert refused.status_code == 413
    assert "max_windows_per_request" in refused.json()["error"]["message"]
    assert post(server, predict_url, b"still fine").status_code == 200


def test_request_over_max_request_size_is_refused_by_the_frontend(server, predict_url) -> None:
    """A body over max_request_size (1 MiB) is refused before any worker sees it; the server stays up."""
    response = post(server, predict_url, b"a" * (1024 * 1024 + 1))
    assert response.status_code == 413
    assert post(server, predict_url, b"still fine").status_code == 200


def test_inference_requires_the_token(server, predict_url) -> None:
    """Token authorization is on: no token, no prediction (TorchServe answers 400)."""
    response = requests.post(
        predict_url, data=b"hello", headers={"Content-Type": "text/plain"}, timeout=30
    )
    assert response.status_code == 400
    assert "Token" in response.text


def expected_workers(server: Any) -> tuple[rules.Machine, int]:
    """This machine as the start saw it (its GPUs as TorchServe is given them, else its cores)
    and the workers sizing's rule gives the default model there, from the load the start
    measured on a GPU."""
    machine = probe.read_machine(probe.serving_gpus(server.properties))
    load = server.sizing()["in_force"].get("device_loads", {}).get("bert:1.0")
    if load is None:  # on the CPU, with a worker's memory as the start measured it
        machine = replace(machine, gpus=0)
        worker_bytes = server.sizing()["in_force"]["measured"]["bert:1.0"]["worker_bytes"]
        return machine, rules.workers_for(machine, worker_bytes)[0]
    device_load = rules.DeviceLoad(**load)
    return machine, rules.workers_for(machine, rules.GPU_WORKER_HOST_BYTES, device_load)[0]


def test_batch_settings_and_workers_in_force_are_what_make_status_reports(server) -> None:
    """maxBatchDelay from config.properties, timeouts from the model config; workers (one per
    core of this machine, or as many per GPU as keep it busy), batchSize (measured at start)
    and the queue from server/bert_serve_server/sizing.py, as `make status` reports them and TorchServe runs
    them."""
    response = requests.get(
        f"{server.management_url}/models/bert", headers=server.headers("management"), timeout=30
    )
    model = response.json()[0]
    configured = configured_model()
    assert "batchSize" not in configured, "the shipped config leaves the batch size to the start"
    (in_force,) = server.sizing()["in_force"]["models"]["bert"].values()
    assert model["maxBatchDelay"] == configured["maxBatchDelay"] == in_force["maxBatchDelay"]
    assert model["batchSize"] == in_force["batchSize"] in rules.BATCH_SIZES
    assert any(
        reason.startswith(f"batchSize {model['batchSize']}:")
        for reason in server.sizing()["in_force"]["why"]
    )
    assert model["responseTimeout"] == 60
    machine, workers = expected_workers(server)
    assert model["minWorkers"] == model["maxWorkers"] == workers == len(model["workers"])
    assert in_force["minWorkers"] == workers
    assert int(server.properties["job_queue_size"]) >= workers


def test_make_status_prints_the_defaults_chosen_on_this_machine(server) -> None:
    """`make status` (python -m bert_serve_server status) prints the workers, threads, batch size, queue and
    heap in force with the reasons, and they follow the rules of server/bert_serve_server/sizing.py from this
    machine's cores and the rates the start measured (printed in the reasons)."""
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_serve_server",
            "status",
            "--state-dir",
            str(server.state_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    print(printed)
    entry = dict(
        item.split(" ", 1)
        for item in re.search(r"^model bert 1\.0: (.*)$", printed, re.MULTILINE)[1].split(", ")
    )
    queue, threads = map(
        int,
        re.search(
            r"^job_queue_size (\d+); torch threads per worker (\d+)$", printed, re.MULTILINE
        ).groups(),
    )
    heap_mb = rules.heap_mib_in(re.search(r"^vmargs (.*)$", printed, re.MULTILINE)[1])
    rates_line = re.search(r"why: batchSize \d+: .*\((.*)\)$", printed, re.MULTILINE)[1]
    rates = {int(size): float(rate) for rate, size in re.findall(r"([\d.]+) at (\d+)", rates_line)}
    assert sorted(rates) == list(rules.BATCH_SIZES)

    machine, workers = expected_workers(server)
    batch_size, _ = rules.batch_size_for(rates)
    max_request = int(server.properties["max_request_size"])
    request_bytes = rules.queued_request_bytes(max_request, *archive_limits(MAR_PATH))
    worker_bytes = server.sizing()["in_force"]["measured"]["bert:1.0"]["worker_bytes"]
    vmargs = server.properties.get("vmargs", "")
    given = rules.QueueInputs(
        workers,
        rates[batch_size],
        request_bytes,
        reserved_bytes=workers * worker_bytes,
        gc=rules.jvm_gc(machine, vmargs),
        vmargs=vmargs,
    )
    expected_queue, expected_heap, _ = rules.derive(machine, given)
    assert (int(entry["minWorkers"]), int(entry["maxWorkers"]), threads) == (
        workers,
        workers,
        rules.threads_for(machine, workers),
    )
    assert int(entry["batchSize"]) == batch_size
    assert (queue, heap_mb) == (expected_queue, expected_heap)
    model = requests.get(
        f"{server.management_url}/models/bert", headers=server.headers("management"), timeout=30
    ).json()[0]
    assert (model["batchSize"], model["minWorkers"]) == (batch_size, workers), "not what runs"


BAD_ITEMS = [
    (b"", "text/plain", "empty_text"),
    (b'{"text": null}', "application/json", "invalid_type"),
    (b"{oops", "application/json", "invalid_json"),
    (b"\xff\xff", "text/plain", "invalid_encoding"),
    (b"z" * 10_050, "text/plain", "payload_too_large"),
    (b'{"other": 1}', "application/json", "missing_field"),
]
GOOD_TEXTS = [
    "An absolute delight from start to finish.",
    "A tedious, joyless mess.",
    "Fine.",
    "The hotel room was spotless and the view over the harbour was breathtaking every morning.",
    "Customer support hung up on me twice and never fixed the billing error.",
    "meh",
    "I expected more from the sequel; the jokes fell flat and the plot went nowhere at all.",
    "Five stars, would buy again!",
]


def test_batch_poisoning_does_not_spread(server, predict_url) -> None:
    """48 concurrent requests, a quarter malformed: every valid one answers 200 with the same
    scores as when sent alone, every malformed one gets its own 4xx, and batches really formed."""
    before = model_log(server).stat().st_size
    alone = {text: post(server, predict_url, text.encode()).json()["scores"] for text in GOOD_TEXTS}
    _, log_offset = logged_batches(model_log(server), before, len(GOOD_TEXTS))
    jobs = [("good", text.encode(), "text/plain", text) for text in GOOD_TEXTS * 4 + GOOD_TEXTS[:4]]
    jobs += [("bad", data, content_type, code) for data, content_type, code in BAD_ITEMS * 2]
    jobs = jobs[::2] + jobs[1::2]
    assert len(jobs) == 48 and sum(kind == "bad" for kind, *_ in jobs) == 12

    def send(job):
        kind, data, content_type, expected = job
        return job, post(server, predict_url, data, content_type)

    with ThreadPoolExecutor(max_workers=48) as pool:
        results = list(pool.map(send, jobs))

    for (kind, _, _, expected), response in results:
        if kind == "good":
            assert response.status_code == 200, response.text
            assert response.json()["scores"] == pytest.approx(alone[expected], abs=1e-4)
        else:
            assert 400 <= response.status_code < 500
            assert response.json()["error"]["code"] == expected

    sizes, _ = logged_batches(model_log(server), log_offset, len(jobs))
    print(f"batch sizes formed under the poisoning load: {sizes}")
    assert sum(sizes) == 48
    assert max(sizes) > 1, f"no request was batched: {sizes}"


def test_curl_smoke_script_passes(server) -> None:
    """scripts/smoke.sh, the same one `make smoke` runs, against this server."""
    result = subprocess.run(
        ["bash", "scripts/smoke.sh", str(server.state_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failed" in result.stdout


def test_models_cannot_be_registered_over_http(server) -> None:
    """enable_model_api=false: even with the management token, POST /models is refused."""
    response = requests.post(
        f"{server.management_url}/models",
        params={"url": "https://example.invalid/evil.mar"},
        headers=server.headers("management"),
        timeout=30,
    )
    assert response.status_code == 405, response.text


def test_list_request_answers_each_text_in_order(server, predict_url) -> None:
    """{"texts": [...]}: one entry per text; a bad text fails alone; over 64 texts is a 413."""
    texts = ["An absolute delight from start to finish.", "", "A tedious, joyless mess.", 7]
    response = post(server, predict_url, json.dumps({"texts": texts}), "application/json")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [entry.get("label") for entry in results] == ["positive", None, "negative", None]
    assert [entry.get("error", {}).get("code") for entry in results] == [
        None,
        "empty_text",
        None,
        "invalid_type",
    ]
    too_many = post(server, predict_url, json.dumps({"texts": ["fine"] * 65}), "application/json")
    assert too_many.status_code == 413
    assert too_many.json()["error"]["code"] == "payload_too_large"
