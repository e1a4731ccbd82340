"""Benchmark: served throughput and latency, side by side, in one run.

Scenarios, all on the same model and the same deterministic mixed-length corpus:

- ``ceiling``: tokenization + forward with no HTTP, in as many single-threaded processes as
  the default config has workers, at each batch size with length grouping; the best is the
  in-process ceiling;
- ``torchserve_bs1``: TorchServe with batchSize 1, the one-request-at-a-time path;
- ``torchserve_batched``: TorchServe with the default config/config.properties (fp32);
- ``torchserve_bf16``: the same with ``precision: bf16`` packed in the .mar (the fast mode of
  ``make serve PRECISION=bf16``), when this CPU has native bf16;
- ``precision``: fp32 against bf16 on the whole corpus through the handler's classify
  (``bert_serve.harness.compare``): speed, largest score change, labels unchanged;
- ``litserve`` and ``litserve_tuned``: LitServe servers of the same model
  (``scripts/litserve_peer.py``), what users pick instead: out of the box (one worker, no
  batching), and configured like our default (2 workers x 1 thread, batches of 16 in 1 ms);
- ``client_lists``: on the default server, the Python client's ``classify_many`` (list
  requests of up to 64 texts, a few in flight) over a fixed set of texts.

Each served scenario has its own server on free 127.0.0.1 ports; all run at once, and at
each concurrency level each gets a warm-up and a bounded closed loop in turn (so a slow
spell of a shared machine falls on all alike); all are stopped at the end. Writes
``results.json`` and ``serving.png`` into ``--out`` (docs/bench/README.md reads them), and
prints the issue's bars, each with its value and whether it is met.

    python scripts/bench.py --out docs/bench            # the full run (about 10 minutes)
    python scripts/bench.py --smoke --out /tmp/bench    # a few seconds, to keep the tool working
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from bert_serve.harness import inprocess
from bert_serve.harness.archive import DEFAULT_MODEL_DIR, package_variant
from bert_serve.harness.compare import compare_precision, config_settings
from bert_serve.harness.config import (
    BASE_CONFIG,
    MODEL_NAME,
    MODEL_VERSION,
    ROOT,
    models_entry,
    read_properties,
)
from bert_serve.harness.corpus import corpus_stats, make_corpus
from bert_serve.harness.measure import (
    Endpoint,
    Loads,
    client_lists,
    cpu_split,
    endpoint,
    interleaved,
    servers,
)
from bert_serve.harness.peer import PEER_CONFIGS, litserve_peer
from bert_serve.harness.reports import bench_ratios, plot_bench
from handler.precision import cpu_has_native_bf16


def step(title: str) -> None:
    print(f"[bench] {title}", file=sys.stderr)


def served(args: argparse.Namespace, corpus: list[str]) -> dict[str, Any]:
    """Every server (default, batch size 1, bf16, the LitServe peers) measured in turn at each
    load; then, the peers stopped, where the CPU goes and the client's list requests on the
    default server. The smoke run keeps the default server."""
    smoke, model_dir = args.smoke, args.model_dir
    scenarios: dict[str, Any] = {}
    levels = [2] if smoke else [1, 8, 32, 64]
    list_runs = [(16, 2)] if smoke else [(64, 4), (16, 8), (16, 32), (32, 32)]
    list_texts = corpus[: 64 if smoke else 1500]
    loads = Loads(levels, args.seconds, args.warmup)
    with tempfile.TemporaryDirectory(prefix="bench-bf16-") as store, ExitStack() as stack:
        configs: dict[str, dict[str, str]] = {"torchserve_batched": {}}
        if not smoke:
            configs["torchserve_bs1"] = {"models": models_entry(batch_size=1)}
            if cpu_has_native_bf16():
                package_variant(
                    Path(store), handler_changes={"precision": "bf16"}, model_dir=model_dir
                )
                configs["torchserve_bf16"] = {"model_store": store}
        step(f"starting {', '.join(configs)}")
        started = stack.enter_context(servers(configs))
        endpoints = [endpoint(name, item["server"]) for name, item in started.items()]
        with ExitStack() as peers:
            for peer, peer_config in ({} if smoke else PEER_CONFIGS).items():
                step(f"starting the LitServe peer {peer}")
                running_peer = peers.enter_context(litserve_peer(model_dir, peer_config))
                endpoints.append(
                    Endpoint(peer, running_peer.url, {}, None, running_peer.process_group)
                )
            step("every server in turn at each load")
            measured = interleaved(endpoints, corpus, loads)
            step("stopping the LitServe peers (idle, they still use CPU)")
        for name, item in started.items():
            scenarios[name] = {
                key: item[key] for key in ("config", "startup_s", "worker_memory")
            } | {"by_concurrency": measured[name]}
        for peer, peer_config in PEER_CONFIGS.items():
            if peer in measured:
                scenarios[peer] = {"config": peer_config, "by_concurrency": measured[peer]}
        default_server = started["torchserve_batched"]["server"]
        if not smoke:
            step("where the CPU goes on the default server at 32 clients")
            scenarios["torchserve_batched"]["cpu_split"] = cpu_split(
                default_server, corpus, 32, loads
            )
        step("client list requests on the default server")
        scenarios["torchserve_batched"]["client_lists"] = [
            client_lists(default_server, list_texts, *run) for run in list_runs
        ]

    return scenarios


def run(args: argparse.Namespace, corpus: list[str]) -> dict[str, Any]:
    """The experiments, in order; the smoke run keeps the ceiling and the default server."""
    smoke = args.smoke
    model_dir = args.model_dir
    ceiling_sizes, ceiling_s = ([1, 16], 1) if smoke else ([1, 8, 16, 32], 4)
    results: dict[str, Any] = {}

    step("in-process ceiling, first pass")
    workers = json.loads(read_properties(BASE_CONFIG)["models"])[MODEL_NAME][MODEL_VERSION][
        "minWorkers"
    ]
    first_pass = inprocess.ceiling(model_dir, corpus, ceiling_sizes, ceiling_s, workers)
    if not smoke:
        step("execution options (in-process)")
        results["execution_options"] = inprocess.execution_options(model_dir, corpus, 5)
        step("max_batch_tokens sweep (in-process, batch 16)")
        budgets = [128, 256, 512, 1024, 2048, 8192]
        results["budget_sweep"] = inprocess.budget_sweep(model_dir, corpus, budgets, 3)
        if cpu_has_native_bf16():
            step("fp32 vs bf16 on the corpus (in-process, the handler's classify)")
            results["precision"] = compare_precision(
                model_dir, corpus, "bf16", config_settings(), seconds=0
            )

    scenarios = served(args, corpus)

    step("in-process ceiling, second pass")
    second_pass = inprocess.ceiling(model_dir, corpus, ceiling_sizes, ceiling_s, workers)
    results["ceiling"] = inprocess.best_of(first_pass, second_pass)
    results["scenarios"] = scenarios
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--seconds", type=float, default=8, help="measured time per concurrency level"
    )
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument(
        "--smoke", action="store_true", help="a few seconds: ceiling and batched TorchServe only"
    )
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.warmup = 1.5, 0.5
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus()
    results: dict[str, Any] = {
        "command": "make bench" if not args.smoke else "python scripts/bench.py --smoke",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "corpus": corpus_stats(corpus),
        "seconds_per_level": args.seconds,
    }
    results |= run(args, corpus)
    results["ratios"] = bench_ratios(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_bench(results, args.out)
    print(json.dumps(results["ratios"], indent=2))
    step(f"wrote {args.out / 'results.json'} and serving.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
