"""TorchServe's own start of the shipped config serves batched, with threads that fit the cores.

A user who follows TorchServe's documentation packs the archive with ``torch-model-archiver``
and runs ``torchserve --start --ts-config config/config.properties --model-store model_store``
from the repository root (the README's commands, both run here), not the project's start. That start reads config.properties as written, sets
no ``OMP_NUM_THREADS`` and sizes nothing: before, it served batchSize 1 with one worker per
core, each on torch's default threads (cores x cores). Here that very command runs in a copy
of the repository's ``config/`` whose ports alone are rewritten (free 127.0.0.1 ports), with a
TMPDIR of its own (TorchServe's pid file) and no ``OMP_NUM_THREADS``; it is always stopped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from bert_serve_server.archive import archiver_command
from bert_serve_server.config import free_port, read_properties
from bert_serve_server.control import Server, stop, torchserve_command, wait_ready

from lab.batchlog import logged_batches
from lab.corpus import make_corpus
from tests.conftest import REAL_MODEL_DIR

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "config"
COMMAND = ["--start", "--ts-config", "config/config.properties", "--model-store", "model_store"]
"""TorchServe's documented start, as the README shows it beside `make serve`."""
PORT_KEYS = (
    "inference_address",
    "management_address",
    "metrics_address",
    "grpc_inference_port",
    "grpc_management_port",
)
CLIENTS = 16
REQUESTS_PER_CLIENT = 8
THREADS = re.compile(r"batch_size=\d+ .* threads=(\d+) ")
SIZING_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TS_CONFIG_FILE", "LOG_LOCATION")
"""Variables that would size or move what the plain start does: none is set for it."""


def with_free_ports(text: str) -> str:
    """The config's text with every listener on a free 127.0.0.1 port, nothing else changed."""
    lines = []
    for line in text.splitlines():
        key = line.partition("=")[0]
        if key in PORT_KEYS:
            port = free_port()
            line = f"{key}=http://127.0.0.1:{port}" if key.endswith("address") else f"{key}={port}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def archive_as_the_readme_does(store: Path) -> None:
    """The README's torch-model-archiver command (TorchServe's own archiver, as its docs write
    it): the handler package and the model as model/, beside the entry point."""
    extra = store.parent / "extra"
    shutil.copytree(
        ROOT / "handler", extra / "handler", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(REAL_MODEL_DIR, extra / "model")
    subprocess.run(
        [
            archiver_command(),
            *("--model-name", "bert", "--version", "1.0", "--handler", "handler/bert_handler.py"),
            *("--extra-files", str(extra), "--config-file", "config/model-config.yaml"),
            *("--export-path", str(store), "--force"),
        ],
        cwd=ROOT,
        env=os.environ | {"TMPDIR": str(store.parent)},  # it empties $TMPDIR/<model name>
        check=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("plain-start")
    shutil.copytree(CONFIG_DIR, root / "config")
    (root / "model_store").mkdir()
    config = root / "config" / "config.properties"
    config.write_text(with_free_ports((CONFIG_DIR / "config.properties").read_text()))
    archive_as_the_readme_does(root / "model_store")
    server = Server(state_dir=root, properties=read_properties(config))
    server.tmp_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in SIZING_ENV and "BERT_SERVE" not in k}
    try:
        subprocess.run(
            [torchserve_command(), *COMMAND],
            cwd=root,
            env=env | {"TMPDIR": str(server.tmp_dir)},
            stdin=subprocess.DEVNULL,
            check=True,
            timeout=60,
        )
        wait_ready(server, timeout=180)
        yield server
    finally:
        stop(server)


def post(server: Server, text: str) -> int:
    headers = server.headers() | {"Content-Type": "application/json"}
    body = json.dumps({"text": text})
    return requests.post(server.predict_url, data=body, headers=headers, timeout=60).status_code


def test_the_plain_start_serves_batched_within_the_cores(plain: Server) -> None:
    """The management API shows the file's batchSize (more than 1) and the workers (the file's,
    else TorchServe's default: one per CPU, or per GPU); 16 clients at once get batches of
    several texts; and every batch ran on threads that, times the workers, do not exceed the
    CPUs there are."""
    (entry,) = json.loads(plain.properties["models"])["bert"].values()
    model = plain.model()
    workers = len(model["workers"])
    assert model["batchSize"] > 1, f"served unbatched: {model}"
    assert (model["batchSize"], model["maxBatchDelay"]) == (
        entry.get("batchSize"),
        entry["maxBatchDelay"],
    )
    assert model["minWorkers"] == model["maxWorkers"] == workers >= 1
    assert entry.get("minWorkers", workers) == workers, "the file's workers, else TorchServe's"

    texts = make_corpus(CLIENTS * REQUESTS_PER_CLIENT)
    offset = plain.model_log.stat().st_size
    with ThreadPoolExecutor(CLIENTS) as pool:
        statuses = list(pool.map(lambda text: post(plain, text), texts))
    assert statuses == [200] * len(texts)
    sizes, end = logged_batches(plain.model_log, offset, len(texts))
    assert sum(sizes) == len(texts) and max(sizes) > 1, sizes

    with plain.model_log.open("rb") as log:
        log.seek(offset)
        lines = log.read(end - offset).decode(errors="replace")
    threads = [int(count) for count in THREADS.findall(lines)]
    assert len(threads) == len(sizes), "every batch line says its threads"
    cores = len(os.sched_getaffinity(0))
    assert workers * max(threads) <= cores, (workers, threads, cores)
