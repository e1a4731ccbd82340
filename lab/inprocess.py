"""The in-process ceiling of the benchmark and the GPU report: the handler's tokenize + forward
code with no server.

Texts are taken in arrival order from the corpus, in windows of one batch, length-grouped
under ``max_batch_tokens`` as the handler does.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from handler.inference import classify
from handler.model import load_model
from handler.settings import HandlerSettings


def with_best(runs: dict[str, dict[str, float]]) -> dict[str, Any]:
    best = max(runs, key=lambda size: runs[size]["texts_per_s"])
    return {
        "by_batch_size": runs,
        "best_batch_size": int(best),
        "texts_per_s": runs[best]["texts_per_s"],
    }


def batch_sizes_timed(
    model_dir: Path,
    corpus: Sequence[str],
    batch_sizes: Sequence[int],
    seconds: float,
    gpu_id: int | None = None,
    precision: str = "fp32",
) -> dict[str, dict[str, float]]:
    """One single-threaded process's texts/s and batch times at each batch size (on GPU
    ``gpu_id`` where given) in ``precision``: consecutive windows of the corpus for ``seconds``
    each."""
    settings = HandlerSettings(torch_threads=1, precision=precision)
    loaded = load_model(model_dir, settings, gpu_id=gpu_id)
    length, tokens = settings.max_length, loaded.max_batch_tokens
    classify(loaded, list(corpus[:32]), length, tokens)
    runs = {}
    for batch_size in batch_sizes:
        done, batch_ms, started = 0, [], time.perf_counter()
        while time.perf_counter() - started < seconds:
            window = [corpus[(done + i) % len(corpus)] for i in range(batch_size)]
            batch_started = time.perf_counter()
            classify(loaded, window, length, tokens)
            batch_ms.append((time.perf_counter() - batch_started) * 1000)
            done += batch_size
        batch_ms.sort()
        runs[str(batch_size)] = {
            "texts_per_s": round(done / (time.perf_counter() - started), 1),
            "batch_ms_p50": round(batch_ms[len(batch_ms) // 2], 1),
            "batch_ms_p90": round(batch_ms[int(len(batch_ms) * 0.9)], 1),
        }
    return runs


def ceiling(
    model_dir: Path,
    corpus: Sequence[str],
    batch_sizes: Sequence[int],
    seconds: float,
    processes: int,
    on_gpus: bool = False,
    precision: str = "fp32",
) -> dict[str, Any]:
    """In-process texts/s at each batch size, as the served layout computes: ``processes``
    single-threaded processes at once (the workers; with ``on_gpus``, dealt over the GPUs as
    TorchServe deals its workers), their texts/s summed. The best is the
    ceiling a server could reach. One process with several torch threads is not used: its
    threads scale poorly on these small matrices and collapse when the machine is shared."""
    context = multiprocessing.get_context("spawn")
    gpus = torch.cuda.device_count() if on_gpus else 0
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        texts = list(corpus)
        jobs = [
            pool.submit(
                batch_sizes_timed, model_dir, texts, batch_sizes, seconds, gpu_id, precision
            )
            for gpu_id in [index % gpus if gpus else None for index in range(processes)]
        ]
        per_process = [job.result() for job in jobs]
    runs = {}
    for size in map(str, batch_sizes):
        measured = [process[size] for process in per_process]
        runs[size] = {
            "texts_per_s": round(sum(m["texts_per_s"] for m in measured), 1),
            "batch_ms_p50": max(m["batch_ms_p50"] for m in measured),
            "batch_ms_p90": max(m["batch_ms_p90"] for m in measured),
        }
        print(f"  ceiling batch {size}: {runs[size]['texts_per_s']} texts/s", file=sys.stderr)
    return with_best(runs) | {"processes": processes, "torch_threads": 1, "precision": precision}


def best_of(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Per batch size, the better of two passes (one before, one after the served runs): a
    ceiling is a best case, and one pass on a noisy 2-core machine can be disturbed."""
    runs = {
        size: max(run, second["by_batch_size"][size], key=lambda run: run["texts_per_s"])
        for size, run in first["by_batch_size"].items()
    }
    kept = {key: first[key] for key in ("processes", "torch_threads", "precision")}
    return with_best(runs) | {"passes": 2} | kept
