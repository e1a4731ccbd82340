"""The benchmark's experiments, in the order ``scripts/bench.py`` runs them.

- ``ceiling``: tokenization + forward with no HTTP, in as many single-threaded processes as
  the default config has workers, at each batch size with length grouping, once before and
  once after the served runs (the better of the two per batch size);
- ``execution_options``, ``budget_sweep``, ``precision``: in-process comparisons (attention
  kernels, bf16; max_batch_tokens; fp32 against bf16 through the handler's classify);
- ``scenarios``: every served mode measured in turn at each load (``served``), then the CPU
  split and the client's list requests on the default server.

The smoke form keeps the ceiling and the default server, with a few seconds each.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_serve_server import probe, rules
from bert_serve_server.archive import package_variant
from bert_serve_server.config import models_entry
from bert_serve_server.control import Server

from handler.model import load_model
from handler.precision import cpu_has_native_bf16
from lab import inprocess
from lab.compare import compare_precision, config_settings
from lab.measure import Endpoint, Loads, client_lists, cpu_split, endpoint, interleaved, servers
from lab.peer import OUT_OF_THE_BOX, configured_like, litserve_peer

SERVER_KEYS = ("config", "startup_s", "worker_memory")
BUDGETS = [128, 256, 512, 1024, 2048, 8192]


@dataclass(frozen=True)
class Plan:
    """What one run measures: the model, seconds per load level, the smoke form or not, and
    the device (``cpu`` or ``cuda``: the served workers and the in-process runs alike)."""

    model_dir: Path
    seconds: float
    warmup: float
    smoke: bool = False
    device: str = "cpu"

    @property
    def gpus(self) -> int:
        return probe.gpu_count() if self.device == "cuda" else 0

    @property
    def loads(self) -> Loads:
        return Loads([2] if self.smoke else [1, 8, 32, 64], self.seconds, self.warmup)

    @property
    def list_runs(self) -> list[tuple[int, int]]:
        """(chunk size, requests in flight) of the client's list requests."""
        return [(16, 2)] if self.smoke else [(64, 4), (16, 8), (16, 32), (32, 32)]

    @property
    def ceiling_sizes(self) -> list[int]:
        return [1, 16] if self.smoke else [1, 8, 16, 32]

    @property
    def ceiling_s(self) -> float:
        return 1 if self.smoke else 4


def step(title: str) -> None:
    print(f"[bench] {title}", file=sys.stderr)


def torchserve_configs(plan: Plan, store: Path) -> dict[str, dict[str, str]]:
    """The served TorchServe modes: the default; batch size 1 and bf16 (packaged into
    ``store``, where this CPU has native bf16) unless in the smoke form."""
    on_device = {"number_of_gpu": str(plan.gpus)}
    configs: dict[str, dict[str, str]] = {"torchserve_batched": on_device}
    if not plan.smoke:
        configs["torchserve_bs1"] = on_device | {"models": models_entry(batch_size=1)}
        if plan.gpus or cpu_has_native_bf16():
            package_variant(store, handler_changes={"precision": "bf16"}, model_dir=plan.model_dir)
            configs["torchserve_bf16"] = on_device | {"model_store": str(store)}
    return configs


@contextmanager
def peers(plan: Plan, configs: dict[str, dict[str, float]]) -> Iterator[list[Endpoint]]:
    """The LitServe peers (none in the smoke form), running until the block ends."""
    with ExitStack() as stack:
        endpoints = []
        if plan.smoke:
            configs = {}
        elif importlib.util.find_spec("litserve") is None:
            step("LitServe is not installed here: the peers are left out")
            configs = {}
        for peer, peer_config in configs.items():
            step(f"starting the LitServe peer {peer}")
            running_peer = stack.enter_context(litserve_peer(plan.model_dir, peer_config))
            endpoints.append(Endpoint(peer, running_peer.url, {}, None, running_peer.process_group))
        yield endpoints
        step("stopping the LitServe peers (idle, they still use CPU)")


def served(plan: Plan, corpus: list[str]) -> dict[str, Any]:
    """Every server (default, batch size 1, bf16, the LitServe peers) measured in turn at each
    load; then, the peers stopped, where the CPU goes and the client's list requests on the
    default server."""
    with tempfile.TemporaryDirectory(prefix="bench-bf16-") as store, ExitStack() as stack:
        configs = torchserve_configs(plan, Path(store))
        step(f"starting {', '.join(configs)}")
        started = stack.enter_context(servers(configs))
        endpoints = [endpoint(name, item["server"]) for name, item in started.items()]
        default_server = started["torchserve_batched"]["server"]
        peer_configs = {
            "litserve": OUT_OF_THE_BOX,
            "litserve_tuned": configured_like(default_server.sizing()["in_force"]),
        }
        with peers(plan, peer_configs) as peer_endpoints:
            step("every server in turn at each load")
            measured = interleaved(endpoints + peer_endpoints, corpus, plan.loads)
        scenarios: dict[str, Any] = {
            name: {key: item[key] for key in SERVER_KEYS} | {"by_concurrency": measured[name]}
            for name, item in started.items()
        }
        for peer, peer_config in peer_configs.items():
            if peer in measured:
                scenarios[peer] = {"config": peer_config, "by_concurrency": measured[peer]}
        default = scenarios["torchserve_batched"]
        default |= on_default_server(plan, default_server, corpus)
    return scenarios


def on_default_server(plan: Plan, server: Server, corpus: list[str]) -> dict[str, Any]:
    """Where the CPU goes at 32 clients (not in the smoke form), and the client's list
    requests over a fixed set of texts."""
    extra: dict[str, Any] = {}
    if not plan.smoke:
        step("where the CPU goes on the default server at 32 clients")
        extra["cpu_split"] = cpu_split(server, corpus, 32, plan.loads)
    step("client list requests on the default server")
    texts = corpus[: 64 if plan.smoke else 1500]
    extra["client_lists"] = [client_lists(server, texts, *run) for run in plan.list_runs]
    return extra


def in_process(plan: Plan, corpus: list[str]) -> dict[str, Any]:
    """The in-process comparisons (none in the smoke form; on a GPU, the budget sweep only:
    the others compare CPU kernels)."""
    if plan.smoke:
        return {}
    results: dict[str, Any] = {}
    if plan.gpus:
        step("max_batch_tokens sweep (in-process, batch 16, GPU 0)")
        results["budget_sweep"] = inprocess.budget_sweep(plan.model_dir, corpus, BUDGETS, 3, 0)
        return results
    step("execution options (in-process)")
    results["execution_options"] = inprocess.execution_options(plan.model_dir, corpus, 5)
    step("max_batch_tokens sweep (in-process, batch 16)")
    results["budget_sweep"] = inprocess.budget_sweep(plan.model_dir, corpus, BUDGETS, 3)
    if cpu_has_native_bf16():
        step("fp32 vs bf16 on the corpus (in-process, the handler's classify)")
        results["precision"] = compare_precision(
            plan.model_dir, corpus, "bf16", config_settings(), seconds=0
        )
    return results


def ceiling_processes(model_dir: Path, gpus: int) -> int:
    """The workers the default config gets here with ``gpus`` GPUs, for a model folder (the
    in-process ceiling runs as many processes), by the start's own rule."""
    if gpus:
        settings = config_settings()
        loaded = load_model(model_dir, settings, 0)
        load = probe.measure_device_load(loaded, settings, max(rules.BATCH_SIZES))
        return rules.workers_for(probe.read_machine(gpus), rules.GPU_WORKER_HOST_BYTES, load)[0]
    weights = sum(path.stat().st_size for path in model_dir.glob("*.safetensors"))
    worker_bytes = (
        weights + rules.UNMEASURED_WORKER_OVERHEAD_BYTES
    )  # a folder, not a .mar to measure
    return rules.workers_for(probe.read_machine(gpus), worker_bytes)[0]


def run(plan: Plan, corpus: list[str]) -> dict[str, Any]:
    """The experiments, in order: ceiling, in-process comparisons, served, ceiling again."""
    workers = ceiling_processes(plan.model_dir, plan.gpus)

    def ceiling() -> dict[str, Any]:
        return inprocess.ceiling(
            plan.model_dir, corpus, plan.ceiling_sizes, plan.ceiling_s, workers, bool(plan.gpus)
        )

    step("in-process ceiling, first pass")
    first_pass = ceiling()
    results = in_process(plan, corpus)
    scenarios = served(plan, corpus)
    step("in-process ceiling, second pass")
    results["ceiling"] = inprocess.best_of(first_pass, ceiling())
    results["scenarios"] = scenarios
    return results
