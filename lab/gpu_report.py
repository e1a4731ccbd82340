"""The GPU report (``make gpu-report``): the served model on one machine's GPU, every run the issue
of the GPU bars asks for, in one call that fits one lent device call.

On a bert-base-shaped BERT (random weights, seeded; the default model's tokenizer) it runs
``SECTIONS`` in order, the bars' runs first (docs/gpu/README.md says what each measures): the
default start (no precision set: whatever the default is) and workers per GPU swept around its
choice; precision fp32 pinned (against the CPU and the default's top labels); LitServe configured
like the default; batchSize 1; the lone request in process and served captured; tf32; the
in-process ceiling.

Each level is a closed loop spread over several load processes (``lab.gpu_load``), measured
``repeats`` times back to back (the median requests/s and their spread), with the GPU's and each
host core's busy share and the CPU seconds of the load and of the server; ``lab.gpu_findings``
turns them into the bars and what stops each server. ``results.json`` is rewritten after every
run (a call cut short keeps what it measured; ``phases`` holds each run's seconds), then
``gpu.png``.

The report fits one device call: before each run it checks that its estimate
(``Plan.estimate``) fits in the budget left (``GPU_PLAN.budget_s``), else records it as skipped.
``--smoke`` runs every section on the CPU with a tiny model, 1 and 2 clients, shorter levels;
what the hardware lacks (tf32, CUDA graphs) is skipped with the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bert_serve_server import probe
from bert_serve_server.archive import package_variant
from bert_serve_server.config import ROOT

from lab import gpu_findings, gpu_runs, inprocess
from lab.corpus import corpus_stats, make_corpus
from lab.gpu_load import Loader
from lab.peer import litserve_peer
from lab.report import describe, dumps, write_json
from lab.standins import SHAPES


@dataclass(frozen=True)
class Plan:
    """What one report runs: the model's shape, the loads, seconds per level and the budget."""

    device: str
    shape: str
    levels: tuple[int, ...]
    """The default start's loads (clients); ``top`` the loads of the sweep's other points, and
    ``top[0]`` the one load of fp32 pinned, batchSize 1 and tf32."""
    top: tuple[int, ...]
    warmup_s: float
    seconds: float
    repeats: int
    load_processes: int
    budget_s: float
    sweep_span: tuple[int, int]
    """Workers per GPU below and above the start's choice."""
    lone_seconds: float
    ceiling_sizes: tuple[int, ...]
    start_s: float
    """Estimates: a start measured by the rule (a stated one takes half), one rescaling a
    quarter."""
    with_compile: bool = False
    """The lone request also through ``torch.compile`` (``--with-compile``): inductor compiles
    each bucket it meets, tens of seconds each, unbounded within the call's budget."""

    @property
    def gpus(self) -> int:
        return probe.gpu_count() if self.device == "cuda" else 0

    @property
    def from_32(self) -> tuple[int, ...]:
        return tuple(level for level in self.levels if level >= 32) or self.top

    @property
    def timing(self) -> tuple[float, float, int]:
        return self.warmup_s, self.seconds, self.repeats

    def estimate(self, starts: float, levels: int, rescales: int = 0) -> float:
        """Seconds a run should take: its starts, rescalings and levels."""
        level_s = self.warmup_s + self.repeats * (self.seconds + 0.1) + 0.5
        return (starts + rescales / 4) * self.start_s + levels * level_s


GPU_PLAN = Plan(
    "cuda", "bert-base", levels=(1, 32, 256, 512), top=(256, 512), warmup_s=0.5, seconds=3.0,
    repeats=3, load_processes=6, budget_s=400, sweep_span=(1, 2), lone_seconds=2,
    ceiling_sizes=(1, 16, 64), start_s=40,
)  # fmt: skip
SECTIONS = ("default", "fp32", "peer", "bs1", "lone_request", "tf32", "ceiling")
"""The report's runs, in order; each is written as its figures, skipped with the reason, or its
error (then the command exits 1)."""
SMOKE_PLAN = Plan("cpu", "tiny", (1, 2), (2,), 0.1, 0.4, 2, 2, 3600, (1, 1), 0.5, (1, 16), 10)
SCORED_TEXTS = 128
GPU_COMMAND = (
    ". .gpu-carry/device-setup.sh && . scripts/gpu_device_extra.sh && "
    "python3 -m lab gpu-report --out $OUT/gpu"
)


def step(title: str) -> None:
    print(f"[gpu-report] {title}", file=sys.stderr, flush=True)


@dataclass
class Report:
    """The report as it fills, written after every run."""

    plan: Plan
    out: Path
    model_dir: Path
    stores: dict[str, Path]
    corpus: list[str]
    loader: Loader
    results: dict[str, Any]
    began: float
    scored: dict[str, list[Any]] = field(default_factory=dict)
    """The CPU's and the default's scores of the first ``SCORED_TEXTS`` texts."""

    def left_s(self) -> float:
        return self.plan.budget_s - (time.monotonic() - self.began)

    def run(self, name: str, estimate_s: float, body: Callable[[], dict[str, Any]]) -> None:
        """``body``'s section under ``name``, unless its estimate exceeds the budget left or
        the hardware lacks what it needs (``body`` raises ``Skipped``); a run that fails is
        written as its error, and the next runs."""
        if estimate_s > self.left_s():
            self.results[name] = {
                "skipped": f"budget: needs about {estimate_s:.0f} s, {self.left_s():.0f} s left"
            }
        else:
            step(f"{name} (about {estimate_s:.0f} s, {self.left_s():.0f} s left)")
            started = time.monotonic()
            try:
                self.results[name] = body()
            except Skipped as why:
                self.results[name] = {"skipped": str(why)}
            except Exception as error:  # one failed run must not cost the call the others
                traceback.print_exc()
                self.results[name] = {"error": f"{type(error).__name__}: {error}"}
            self.results["phases"][name] = round(time.monotonic() - started, 1)
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / "results.json", self.results)


class Skipped(Exception):
    """A run this machine cannot do, with the reason."""


def workers_swept(rule: int, span: tuple[int, int]) -> list[int]:
    """Workers per GPU around the rule's choice, the choice first (measured on the server as
    it started)."""
    return [rule] + [n for n in range(max(1, rule - span[0]), rule + span[1] + 1) if n != rule]


def measure(report: Report, levels: Any, server: Any = None, url: str = "", **pids: int) -> Any:
    """``gpu_runs.ladder`` at ``levels`` on a TorchServe ``server``, or ``url`` with ``pids``."""
    url, headers = (server.predict_url, server.headers()) if server else (url, {})
    timing = report.plan.timing
    return gpu_runs.ladder(report.loader, url, headers, report.corpus, levels, timing, server, pids)


def default(report: Report) -> dict[str, Any]:
    """The default start (no precision set), then workers per GPU swept around its choice: the
    choice at every load, the others at the top ones."""
    plan, gpus = report.plan, max(report.plan.gpus, 1)
    with gpu_runs.torchserve(report.stores["default"], plan.gpus) as server:
        report.results["rule"] = choice = gpu_runs.rule_choice(server, plan.gpus)
        texts = report.corpus[:SCORED_TEXTS]
        report.scored["cpu"] = gpu_runs.local_scores(report.model_dir, texts)
        report.scored["default"] = gpu_runs.served_scores(server, texts)
        scores = gpu_runs.largest_change(report.scored["default"], report.scored["cpu"])
        runs = {}
        for per_gpu in workers_swept(choice["workers_per_gpu"], plan.sweep_span):
            if per_gpu * gpus != len(server.workers()):
                gpu_runs.scale(server, per_gpu * gpus)
            step(f"default: {per_gpu} workers per GPU")
            levels = plan.levels if per_gpu == choice["workers_per_gpu"] else plan.top
            runs[str(per_gpu)] = measure(report, levels, server)
    return {
        "precision": choice["precision"],
        "rule_workers_per_gpu": choice["workers_per_gpu"],
        "scores_vs_cpu": scores,
        "by_workers_per_gpu": dict(sorted(runs.items(), key=lambda item: int(item[0]))),
    }


def stated_run(report: Report, store: str, batch_size: int | None = None) -> dict[str, Any]:
    """A server stated like the default (``rule``), from ``store``, at the first top load; fp32
    pinned adds its scores against the CPU's and its top labels against the default's."""
    choice = report.results.get("rule")
    if not choice:
        raise Skipped("the default start did not run, so there is nothing to state")
    if store not in report.stores:
        raise Skipped(f"{store} needs a CUDA GPU (tf32: of compute capability 8.0 or more)")
    extra, out = gpu_runs.stated(choice, batch_size), dict[str, Any]()
    with gpu_runs.torchserve(report.stores[store], report.plan.gpus, extra) as server:
        if store == "fp32" and "cpu" in report.scored:
            served = gpu_runs.served_scores(server, report.corpus[:SCORED_TEXTS])
            out["scores_vs_cpu"] = gpu_runs.largest_change(served, report.scored["cpu"])
            agreed = gpu_runs.top_label_agreement(report.scored["default"], served)
            out["default_top_label_agreement"] = agreed
        levels = measure(report, report.plan.top[:1], server)
    return {"config": extra} | out | {"by_concurrency": levels}


def peer(report: Report) -> dict[str, Any]:
    """LitServe configured like the default: its workers per device, batch size and delay."""
    choice = report.results.get("rule")
    if not choice:
        raise Skipped("the default start did not run, so there is nothing to configure it like")
    config: dict[str, float | str] = {
        "accelerator": "cuda" if report.plan.gpus else "cpu",
        "workers": choice["workers_per_gpu"] if report.plan.gpus else choice["workers"],
        "torch_threads": choice["torch_threads"],
        "max_batch_size": choice["batchSize"],
        "batch_timeout_ms": choice["maxBatchDelay"],
        "api_servers": 0,
    }
    with litserve_peer(report.model_dir, config, ready_timeout=300) as running:
        pids = {f"litserve_{n}": pid for n, pid in enumerate(running.pids())}
        served = measure(report, report.plan.from_32, url=running.url, **pids)
    uvicorn = {
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
    }
    return {"config": config, "uvicorn": uvicorn, "by_concurrency": served}


def lone_request(report: Report) -> dict[str, Any]:
    """A lone text: in process eager against captured, and served captured (on CUDA)."""
    plan = report.plan
    gpu_id = 0 if plan.gpus else None
    captures = ["eager", "cuda_graphs"] if plan.gpus else ["eager"]
    texts = report.corpus[:8]
    out: dict[str, Any] = {}
    if plan.with_compile:
        captures.append("compile")
    out["in_process"] = gpu_runs.lone_in_process(
        report.model_dir, gpu_id, captures, texts, plan.lone_seconds
    )
    served: dict[str, Any] = {}
    choice = report.results.get("rule")
    if "cuda_graphs" not in report.stores:
        served["cuda_graphs"] = {"skipped": "CUDA graphs need CUDA"}
    elif choice:
        extra = gpu_runs.stated(choice)
        with gpu_runs.torchserve(report.stores["cuda_graphs"], plan.gpus, extra) as server:
            served["cuda_graphs"] = measure(report, (1,), server)
    out["served"] = served
    return out


def ceiling(report: Report) -> dict[str, Any]:
    choice = report.results.get("rule") or {"workers": 1}
    return inprocess.ceiling(
        report.model_dir, report.corpus, report.plan.ceiling_sizes, report.plan.seconds,
        choice["workers"], bool(report.plan.gpus),
    )  # fmt: skip


def archives(plan: Plan, model_dir: Path, root: Path) -> dict[str, Path]:
    """One store per handler setting the report serves: the default (no precision set), fp32
    pinned, and tf32 and CUDA graphs where this machine has them."""
    variants: dict[str, dict[str, Any]] = {"default": {}, "fp32": {"precision": "fp32"}}
    if plan.gpus:
        variants["tf32"] = {"precision": "tf32"}
        variants["cuda_graphs"] = {"capture": "cuda_graphs"}
    stores = {}
    for name, changes in variants.items():
        stores[name] = root / name
        package_variant(stores[name], handler_changes=changes, model_dir=model_dir)
    return stores


def machine(plan: Plan) -> dict[str, Any]:
    facts = describe()
    if plan.gpus:
        import torch

        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpus"] = plan.gpus
        facts["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        facts["cuda"] = torch.version.cuda
    return facts


def run(plan: Plan, out: Path, command: str) -> dict[str, Any]:
    """Every run of the report in order, within the plan's budget; the results."""
    began = time.monotonic()
    corpus = make_corpus()
    results: dict[str, Any] = {
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": plan.device,
        "gpus": plan.gpus,
        "machine": machine(plan),
        "plan": {key: value for key, value in plan.__dict__.items()},
        "corpus": corpus_stats(corpus),
        "phases": {},
    }
    with tempfile.TemporaryDirectory(prefix="gpu-report-") as temp:
        step(f"building the {plan.shape} model and its archives")
        model_dir = gpu_runs.build_model(Path(temp, "model"), plan.shape)
        results["model"] = {"shape": plan.shape, "layers_x_width": [SHAPES[gpu_runs.MODEL_SHAPES[plan.shape]][k] for k in ("num_hidden_layers", "hidden_size")], "weights": "random, seed 0"}  # fmt: skip
        stores = archives(plan, model_dir, Path(temp, "stores"))
        results["phases"]["model"] = round(time.monotonic() - began, 1)
        loader = Loader(plan.load_processes)
        report = Report(plan, out, model_dir, stores, corpus, loader, results, began)
        try:
            points = sum(plan.sweep_span) + 1
            sweep_levels = len(plan.levels) + (points - 1) * len(plan.top)
            report.run(
                "default", plan.estimate(1, sweep_levels, points - 1), lambda: default(report)
            )
            report.run("fp32", plan.estimate(0.5, 1), lambda: stated_run(report, "fp32"))
            report.run("peer", plan.estimate(0.5, len(plan.from_32)), lambda: peer(report))
            report.run("bs1", plan.estimate(0.5, 1), lambda: stated_run(report, "default", 1))
            report.run("lone_request", plan.estimate(1.5, 1), lambda: lone_request(report))
            report.run("tf32", plan.estimate(0.5, 1), lambda: stated_run(report, "tf32"))
            report.run("ceiling", plan.start_s / 2, lambda: ceiling(report))
        finally:
            loader.close()
        results["bars"] = gpu_findings.bars(results, plan.top)
        results["figures"] = gpu_findings.figures(results, plan.top[0])
        results["limits"] = gpu_findings.limits(results)
        results["seconds"] = round(time.monotonic() - began, 1)
        report.write()
        gpu_findings.plot(results, out)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab gpu-report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "gpu")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, every section")
    parser.add_argument(
        "--budget-s", type=float, help="the report's own seconds (default: the plan's)"
    )
    parser.add_argument("--with-compile", action="store_true", help="the lone request compiled too")
    parser.add_argument("--level-s", type=float, help="seconds per measurement of a level")
    parser.add_argument("--repeats", type=int, help="measurements of each level")
    args = parser.parse_args(argv)
    plan = replace(SMOKE_PLAN if args.smoke else GPU_PLAN, with_compile=args.with_compile)
    if args.budget_s:
        plan = replace(plan, budget_s=args.budget_s)
    if args.level_s:
        plan = replace(plan, seconds=args.level_s)
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    if plan.device == "cuda" and not plan.gpus:
        print("gpu-report: no CUDA GPU here; `--smoke` runs it on the CPU", file=sys.stderr)
        return 1
    command = "python -m lab gpu-report --smoke" if args.smoke else GPU_COMMAND
    results = run(plan, args.out, command)
    print(dumps({key: results[key] for key in ("bars", "figures", "limits")}))
    step(f"wrote {args.out / 'results.json'} and gpu.png in {results['seconds']} s")
    failed = [name for name in SECTIONS if "error" in results.get(name, {"error": "not run"})]
    if failed:
        step(f"sections that failed: {failed}")
    return 1 if failed else 0
