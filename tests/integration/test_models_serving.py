"""Several classifiers on one TorchServe, as ``make serve MODELS=...`` starts them.

One server for the module, on free 127.0.0.1 ports, always stopped: ``toxicity`` (a multi-label
DistilBERT), ``nli`` in two versions (RoBERTa sentence-pair classifiers of different weights;
the config makes version 2 the default although 1 is listed first) and ``broken`` (a folder
with no tokenizer, refused by name while the others start). Packaged and configured by the same
code as ``make serve MODELS=...`` (``bert_serve_server.config``, ``archive``), batch settings stated so that the start
measures nothing (``bert_serve_server.sizing`` is tested on its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from bert_serve_server.archive import package_models
from bert_serve_server.config import parse_models
from bert_serve_server.control import Server, running

from lab.load import ClosedLoop, Job, statuses
from tests.architectures import build_architecture
from tests.conftest import ROOT
from tests.heads import ITEMS, SERVED_STRIDE, Reference, largest_difference

TOLERANCE = 1e-4
SETTINGS = {"maxBatchDelay": 5, "batchSize": 8, "minWorkers": 1, "maxWorkers": 1}
FIXED = {"job_queue_size": "200", "vmargs": "-Dlog4j.configurationFile=config/log4j2.xml -Xmx512m"}
PAIRS = [item for item in ITEMS if isinstance(item, tuple)]
TEXTS = [item for item in ITEMS if isinstance(item, str)]


class Served:
    def __init__(self, server: Server, references: dict[str, Reference], refused: dict[str, str]):
        self.server = server
        self.references = references
        self.refused = refused

    def post(self, path: str, document: Any) -> requests.Response:
        return requests.post(
            f"{self.server.inference_url}/{path}",
            data=document if isinstance(document, bytes) else json.dumps(document),
            headers=self.server.headers() | {"Content-Type": "application/json"},
            timeout=60,
        )

    def set_default(self, name: str, version: str) -> requests.Response:
        return requests.put(
            f"{self.server.management_url}/models/{name}/{version}/set-default",
            headers=self.server.headers("management"),
            timeout=30,
        )


@pytest.fixture(scope="module")
def served(
    head_model_dir: Callable[..., Path],
    architecture_dir: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("models")
    folders = {
        "toxicity:1.0": head_model_dir("multi_label", "tiny-distilbert"),
        "nli:1": architecture_dir("roberta"),
        "nli:2": build_architecture(root / "nli-2", "roberta", seed=1),
        "broken:1.0": root / "broken",
    }
    shutil.copytree(folders["nli:1"], folders["broken:1.0"], ignore=shutil.ignore_patterns("tok*"))
    specs = parse_models(" ".join(f"{key}={folder}" for key, folder in folders.items()))
    configured = {
        "toxicity": {"1.0": SETTINGS},
        "nli": {"1": SETTINGS, "2": SETTINGS | {"defaultVersion": True}},
    }
    overrides, refused = package_models(specs, root / "store", configured)
    assert overrides is not None
    references = {
        key: Reference(folder, stride=SERVED_STRIDE)
        for key, folder in folders.items()
        if key not in refused
    }
    with running(overrides | FIXED, state_dir=root / "state") as server:
        yield Served(server, references, refused)


def document(item: str | tuple[str, str]) -> dict[str, str]:
    return {"text": item} if isinstance(item, str) else {"text": item[0], "text_pair": item[1]}


def v2_request(items: list[str | tuple[str, str]]) -> dict[str, Any]:
    texts = [item if isinstance(item, str) else item[0] for item in items]
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [len(items)], "data": texts}]
    if all(isinstance(item, tuple) for item in items):
        pairs = [item[1] for item in items]
        inputs.append(
            {"name": "text_pair", "datatype": "BYTES", "shape": [len(items)], "data": pairs}
        )
    return {"inputs": inputs}


def v2_scores(body: dict[str, Any]) -> list[dict[str, float]]:
    (scores,) = [output for output in body["outputs"] if output["name"] == "scores"]
    labels = json.loads(scores["parameters"]["labels"])
    rows, width = scores["shape"]
    flat = scores["data"]
    return [dict(zip(labels, flat[i * width : (i + 1) * width], strict=True)) for i in range(rows)]


def test_a_model_that_cannot_be_served_is_refused_by_name(served: Served) -> None:
    """The folder without a tokenizer is named with the package check's reason; the others
    start (every test below uses them)."""
    assert list(served.refused) == ["broken:1.0"]
    assert "tokenizer" in served.refused["broken:1.0"]
    assert served.server.model_names() == ["toxicity", "nli"]


@pytest.mark.parametrize(
    ("name", "version", "items"),
    [("toxicity", "1.0", TEXTS), ("nli", "2", PAIRS), ("nli", "1", PAIRS)],
)
def test_each_model_answers_like_its_pipeline_on_every_route(
    served: Served, name: str, version: str, items: list[str | tuple[str, str]]
) -> None:
    """/predictions/NAME (the default version), /predictions/NAME/VERSION and the v2 route
    each score what transformers' pipeline scores for that model's own folder, within 1e-4."""
    reference = served.references[f"{name}:{version}"]
    routes = [f"predictions/{name}/{version}"]
    if served.server.default_version(name) == version:
        routes.append(f"predictions/{name}")
    differences = []
    for route in routes:
        for item in items:
            response = served.post(route, document(item))
            assert response.status_code == 200, (route, response.text)
            differences.append(largest_difference(response.json()["scores"], reference(item)))
    if served.server.default_version(name) == version:
        response = served.post(f"v2/models/{name}/infer", v2_request(items))
        assert response.status_code == 200, response.text
        for item, scores in zip(items, v2_scores(response.json()), strict=True):
            differences.append(largest_difference(scores, reference(item)))
    print(f"{name} {version} over {routes}: largest difference {max(differences):.2e}")
    assert max(differences) <= TOLERANCE


def test_bad_items_sent_to_one_model_never_change_the_others_answers(served: Served) -> None:
    """nli's answers alone equal its answers while toxicity gets a flood of bad requests and
    good ones at the same time."""
    alone = [served.post("predictions/nli", document(item)).json()["scores"] for item in PAIRS]
    bad: list[Any] = [b'{"text": ', {"text": ""}, {"texts": [5, "ok", ""]}, {"text": "x" * 20000}]
    jobs = [("predictions/toxicity", body) for body in bad * 5 + TEXTS]
    jobs += [("predictions/nli", document(item)) for item in PAIRS] * 3
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda job: served.post(*job), jobs))
    sent = list(zip(jobs, answers, strict=True))
    assert {answer.status_code for (path, _), answer in sent if "tox" in path} == {200, 400, 413}
    together = [answer for (path, _), answer in sent if path.endswith("nli")]
    for index, answer in enumerate(together):
        assert answer.status_code == 200, answer.text
        assert answer.json()["scores"] == pytest.approx(alone[index % len(PAIRS)], abs=TOLERANCE)


def test_clients_name_the_model_and_version_and_list_what_is_served(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """Client(model=, version=) reaches that version; `bert-serve models` lists each version,
    the default, the head kind and the labels, from the management API."""
    from bert_serve import Client
    from bert_serve.cli import main

    server, item = served.server, PAIRS[1]
    for version in ("1", "2", None):
        client = Client(
            server.inference_url, model="nli", version=version, token=server.key("inference")
        )
        expected = served.references[f"nli:{version or '2'}"](item)
        assert largest_difference(client.classify(*item).scores, expected) <= TOLERANCE
    token = server.key("management") or ""
    assert (
        main(["models", "--management-url", server.management_url, "--token", token, "--json"]) == 0
    )
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_key = {(entry["name"], entry["version"]): entry for entry in listed}
    assert set(by_key) == {("toxicity", "1.0"), ("nli", "1"), ("nli", "2")}
    defaults = {key for key, entry in by_key.items() if entry["default"]}
    assert defaults == {("toxicity", "1.0"), ("nli", "2")}
    assert by_key["toxicity", "1.0"]["head"] == "multi_label"
    assert by_key["toxicity", "1.0"]["labels"] == ["toxic", "insult", "threat", "spam", "off_topic"]
    assert by_key["nli", "1"]["head"] == "single_label"
    assert by_key["nli", "1"]["architecture"] == "RobertaForSequenceClassification"
    assert main(["models", "--management-url", server.management_url, "--token", token]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["NAME", "VERSION", "DEFAULT", "HEAD"] and len(table) == 4


def test_smoke_and_metrics_cover_each_model(served: Served) -> None:
    """`make smoke` checks every served model; the handler's metrics carry each model's name
    and version, and `make metrics` prints a line per model."""
    server = served.server
    versions = (("toxicity", "1.0"), ("nli", "1"), ("nli", "2"))
    for model, version in versions:  # smoke asks the default versions only
        response = served.post(f"predictions/{model}/{version}", {"text": "A short text."})
        assert response.status_code == 200, response.text
    env = os.environ | {"VENV_PYTHON": sys.executable}
    state = str(server.state_dir)
    smoke = subprocess.run(
        ["bash", "scripts/smoke.sh", state],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "model toxicity:" in smoke.stdout and "model nli:" in smoke.stdout
    wanted = {
        f'Batches{{ModelName="{model}",ModelVersion="{version}",' for model, version in versions
    }
    deadline = time.monotonic() + 10  # the frontend reads the metrics from the worker's output
    while True:
        exposition = requests.get(f"{server.metrics_url}/metrics", timeout=10).text
        missing = {line for line in wanted if line not in exposition}
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert not missing
    summary = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_serve_server",
            "metrics",
            "--state-dir",
            state,
            "--seconds",
            "1",
            "--every",
            "1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert summary.returncode == 0, summary.stderr
    assert [line.split("|")[0].strip() for line in summary.stdout.splitlines()] == [
        "toxicity",
        "nli",
    ]


def test_switching_the_default_version_under_load_loses_no_request(served: Served) -> None:
    """16 closed-loop clients on /predictions/nli while the management API's set-default
    moves nli's default from 2 to 1: every request answers 200, and after the switch the
    unversioned route answers version 1's scores."""
    server = served.server
    item = PAIRS[0]
    body = json.dumps(document(item)).encode()
    loop = ClosedLoop(
        server.predict_url_for("nli"),
        server.headers(),
        lambda n: Job(body, "application/json"),
        concurrency=16,
        seconds=20,
        max_requests=20_000,
    )
    switched: list[requests.Response] = []

    async def switch() -> None:
        await asyncio.sleep(1)
        switched.append(await asyncio.to_thread(served.set_default, "nli", "1"))
        await asyncio.sleep(1)
        loop.stopped = True

    loop.run(switch())
    assert switched[0].status_code == 200, switched[0].text
    assert loop.elapsed < 15, "the switch did not happen under load"
    assert statuses(loop.outcomes) == {"200": len(loop.outcomes)}
    assert loop.silently_lost == 0
    answers = [json.loads(outcome.body)["scores"] for outcome in loop.outcomes]
    version_1, version_2 = served.references["nli:1"](item), served.references["nli:2"](item)
    assert largest_difference(answers[0], version_2) <= TOLERANCE
    assert largest_difference(answers[-1], version_1) <= TOLERANCE
    print(f"switched under load: {len(loop.outcomes)} requests in {loop.elapsed:.1f} s, all 200")
    after = served.post("predictions/nli", document(item)).json()["scores"]
    assert largest_difference(after, version_1) <= TOLERANCE
