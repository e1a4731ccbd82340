"""Where a lone request's time goes, and what of it is TorchServe's (``scripts/floor.py``).

Three servers of each kind, measured in turn at 1 and 8 clients:

- ``constant``: a handler that answers a constant (``lab.floor_handler``): the server's
  own floor on this machine, with no decoding, no tokenizer and no model;
- ``free_forward``: the real handler on a model whose forward costs next to nothing (one
  layer, hidden size 16, the real model's tokenizer and labels): the floor plus our decoding,
  validation, tokenization, metrics and rendering;
- ``real``: the real handler on the real model.

TorchServe serves each with config/config.properties as it is; LitServe, out of the box (one
worker, no batching), serves the same three (``scripts/litserve_peer.py``). Then, on the real
TorchServe alone, ``breakdown`` sends one request at a time and splits each one's time with
the handler's timing headers and the frontend's own latency counters.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from bert_serve_server.archive import package_variant, run_archiver
from bert_serve_server.config import MODEL_NAME
from bert_serve_server.control import Server
from bert_serve_server.metrics import scrape

from handler.timings import COMPUTE_TIME, INFERENCE_TIME, QUEUE_TIME, TOKENIZATION_TIME
from lab.inprocess import batch_sizes_timed
from lab.measure import Endpoint, Loads, endpoint, interleaved, servers
from lab.peer import OUT_OF_THE_BOX, litserve_peer
from lab.standins import reshaped

FLOOR_HANDLER = Path(__file__).with_name("floor_handler.py")
KINDS = ("constant", "free_forward", "real")


@dataclass(frozen=True)
class Plan:
    model_dir: Path
    loads: Loads
    lone_requests: int
    peers: bool = True


def constant_archive(store: Path) -> Path:
    """``store/bert.mar`` with the constant handler and nothing else."""
    archive = store / f"{MODEL_NAME}.mar"
    run_archiver(FLOOR_HANDLER, archive)
    return archive


@contextmanager
def torchserve_kinds(model_dir: Path, workdir: Path) -> Iterator[dict[str, Server]]:
    """The three TorchServe servers of KINDS, running until the block ends."""
    stores = {kind: workdir / kind for kind in KINDS}
    constant_archive(stores["constant"])
    tiny = reshaped(model_dir, workdir / "free-forward-model", "free")
    package_variant(stores["free_forward"], model_dir=tiny)
    package_variant(stores["real"], model_dir=model_dir)
    configs = {f"torchserve_{kind}": {"model_store": str(store)} for kind, store in stores.items()}
    with servers(configs) as started:
        yield {name: item["server"] for name, item in started.items()}


@contextmanager
def litserve_kinds(model_dir: Path, workdir: Path) -> Iterator[list[Endpoint]]:
    """LitServe out of the box serving the same three, running until the block ends."""
    models = {"free_forward": workdir / "free-forward-model", "real": model_dir}
    with ExitStack() as stack:
        endpoints = []
        for kind in KINDS:
            config = dict(OUT_OF_THE_BOX)
            if kind == "constant":
                config["constant"] = 1
            peer = stack.enter_context(litserve_peer(models.get(kind, model_dir), config))
            endpoints.append(Endpoint(f"litserve_{kind}", peer.url, {}, None, peer.process_group))
        yield endpoints


def mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 3) if values else 0.0


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def breakdown(server: Server, texts: list[str], count: int) -> dict[str, Any]:
    """``count`` requests, one at a time on one connection, each split into: the frontend's
    queue (``ts_queue_latency_microseconds``), the handler (``x-compute-time``: tokenization,
    forward, and the rest: decoding, validation, scores), the rest inside TorchServe (its
    batch delay, the hand-off to the worker and back, the handler's metrics and log lines)
    and the client's side (HTTP in and out of the frontend). Means in ms, from the frontend's
    counters over the same requests. A handler that sends no timing headers (the constant
    one) counts as taking no time: its time is then in the hand-off."""
    session = requests.Session()
    url, headers = server.predict_url, server.headers()
    for text in texts[:20]:
        session.post(url, json={"text": text}, headers=headers, timeout=30)
    before = scrape(server.metrics_url)
    round_trips, handler, tokenize, forward, in_handler_queue = [], [], [], [], []
    for n in range(count):
        started = time.perf_counter()
        answer = session.post(
            url, json={"text": texts[n % len(texts)]}, headers=headers, timeout=30
        )
        round_trips.append((time.perf_counter() - started) * 1000)
        answer.raise_for_status()
        handler.append(float(answer.headers.get(COMPUTE_TIME, 0)))
        tokenize.append(float(answer.headers.get(TOKENIZATION_TIME, 0)))
        forward.append(float(answer.headers.get(INFERENCE_TIME, 0)))
        in_handler_queue.append(float(answer.headers.get(QUEUE_TIME, 0)))
    after = scrape(server.metrics_url)

    def counted(name: str) -> float:
        return (after.get((name, ""), 0.0) - before.get((name, ""), 0.0)) / 1000 / count

    frontend = counted("ts_inference_latency_microseconds")
    queue = counted("ts_queue_latency_microseconds")
    handler_ms = mean(handler)
    return {
        "requests": count,
        "round_trip_ms": {"p50": median(round_trips), "mean": mean(round_trips)},
        "mean_ms": {
            "client_and_http": round(mean(round_trips) - frontend, 3),
            "frontend_queue": round(queue, 3),
            "torchserve_hand_off": round(frontend - queue - handler_ms, 3),
            "handler": handler_ms,
            "handler_tokenize": mean(tokenize),
            "handler_forward": mean(forward),
            "handler_other": round(handler_ms - mean(tokenize) - mean(forward), 3),
            "handler_before_forward": mean(in_handler_queue),
        },
    }


def lone_forward(model_dir: Path, texts: list[str], seconds: float) -> dict[str, float]:
    """The in-process lone request on one thread: tokenization + forward of one text."""
    timed = batch_sizes_timed(model_dir, texts, [1], seconds)["1"]
    return {"batch_ms_p50": timed["batch_ms_p50"], "texts_per_s": timed["texts_per_s"]}


def run(plan: Plan, texts: list[str]) -> dict[str, Any]:
    """Every kind measured in turn at each load; the peers stopped, the lone-request
    breakdown on the real TorchServe; the servers stopped, the in-process lone forward."""
    with tempfile.TemporaryDirectory(prefix="floor-") as temp:
        workdir = Path(temp)
        with torchserve_kinds(plan.model_dir, workdir) as started:
            points = [endpoint(name, server) for name, server in started.items()]
            with ExitStack() as stack:
                peers = (
                    stack.enter_context(litserve_kinds(plan.model_dir, workdir))
                    if plan.peers
                    else []
                )
                measured = interleaved(points + peers, texts, plan.loads)
            lone = breakdown(started["torchserve_real"], texts, plan.lone_requests)
    return {
        "by_kind": measured,
        "breakdown": lone,
        "in_process_lone": lone_forward(plan.model_dir, texts, plan.loads.seconds),
    }
