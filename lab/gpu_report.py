"""The GPU report (``make gpu-report``): the served model on one machine's GPU, every run the issue
of the GPU bars asks for, in one call that fits one lent device call.

On a bert-base-shaped BERT (random weights, seeded; the default model's tokenizer) it runs
``SECTIONS`` in order, the bars' runs first (docs/gpu/README.md says what each measures): the
rule's start and workers per GPU swept around its choice, in fp32 and bf16; LitServe configured
like it; the lone request in process and served captured; batchSize 1 and tf32 stated like the
default; the in-process ceiling.

Each level is a closed loop spread over several load processes (``lab.gpu_load``), with the
GPU's and the host's busy share and each process's cores; ``lab.gpu_findings`` turns them into
the bars and what stops each server. ``results.json`` is rewritten after every run (a call cut
short keeps what it measured; ``phases`` holds each run's seconds), then ``gpu.png``.

The report fits one device call: before each run it checks that its estimate
(``Plan.estimate``) fits in the budget left (``GPU_PLAN.budget_s``), else records it as skipped.
``--smoke`` runs every section on the CPU with a tiny model, 1 and 2 clients, a sweep of +- 1;
what the hardware lacks (bf16, tf32, CUDA graphs) is skipped with the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bert_serve_server import probe
from bert_serve_server.archive import package_variant
from bert_serve_server.config import ROOT

from handler.precision import cpu_has_native_bf16
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
    warmup_s: float
    seconds: float
    load_processes: int
    budget_s: float
    sweep_span: int
    lone_seconds: float
    ceiling_sizes: tuple[int, ...]
    start_s: float
    """Estimates, corrected by the first real run: a start measured by the rule (a stated one
    takes half), one rescaling takes a tenth."""
    with_compile: bool = False
    """The lone request also through ``torch.compile`` (``--with-compile``): inductor compiles
    each bucket it meets, tens of seconds each, unbounded within the call's budget."""

    @property
    def gpus(self) -> int:
        return probe.gpu_count() if self.device == "cuda" else 0

    @property
    def ladder_s(self) -> float:
        return len(self.levels) * (self.warmup_s + self.seconds + 0.5)

    def estimate(self, run: str, points: int = 1) -> float:
        """Seconds a run should take: its starts, rescalings and ladders."""
        fixed = {"sweep": self.start_s, "stated": self.start_s / 2, "peer": self.start_s / 2}
        scaling = (points - 1) * self.start_s / 8
        return fixed.get(run, self.start_s / 2) + scaling + points * self.ladder_s


GPU_PLAN = Plan(
    "cuda", "bert-base", (1, 8, 32, 128, 256, 512), 0.25, 1.0, 6, 400, 2, 2, (1, 16, 64), 40
)
SECTIONS = ("sweep_fp32", "sweep_bf16", "peer", "lone_request", "bs1", "tf32", "ceiling")
"""The report's runs, in order; each is written as its figures, skipped with the reason, or its
error (then the command exits 1)."""
SMOKE_PLAN = Plan("cpu", "tiny", (1, 2), 0.1, 0.4, 2, 3600, 1, 0.5, (1, 16), 10)
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


def workers_swept(rule: int, span: int) -> list[int]:
    """Workers per GPU around the rule's choice, the choice first (measured on the server as
    it started)."""
    return [rule] + [n for n in range(max(1, rule - span), rule + span + 1) if n != rule]


def sweep(report: Report, precision: str) -> dict[str, Any]:
    """The rule's start for ``precision``, then workers per GPU swept around its choice."""
    plan, gpus = report.plan, max(report.plan.gpus, 1)
    with gpu_runs.torchserve(report.stores[precision], plan.gpus) as server:
        choice = gpu_runs.rule_choice(server, plan.gpus)
        if precision == "fp32":
            report.results["rule"] = choice
            report.results["scores"] = served_against_cpu(report, server)
        runs = {}
        for per_gpu in workers_swept(choice["workers_per_gpu"], plan.sweep_span):
            if per_gpu * gpus != len(server.workers()):
                gpu_runs.scale(server, per_gpu * gpus)
            step(f"{precision}: {per_gpu} workers per GPU")
            runs[str(per_gpu)] = gpu_runs.ladder(
                report.loader, server.predict_url, server.headers(), report.corpus,
                plan.levels, (plan.warmup_s, plan.seconds), server,
            )  # fmt: skip
    return {
        "rule_workers_per_gpu": choice["workers_per_gpu"],
        "rule": choice,
        "by_workers_per_gpu": dict(sorted(runs.items(), key=lambda item: int(item[0]))),
    }


def served_against_cpu(report: Report, server: Any) -> dict[str, Any]:
    """The default fp32 server's scores and logits against this host's CPU in fp32."""
    texts = report.corpus[:64]
    served = gpu_runs.served_scores(server, texts)
    local = gpu_runs.local_scores(report.model_dir, texts)
    return gpu_runs.largest_change(served, local) | {"served_on": report.plan.device}


def stated_run(report: Report, store: str, batch_size: int | None = None) -> dict[str, Any]:
    """A server stated like the default (``rule``), from ``store``, at every load."""
    choice = report.results.get("rule")
    if not choice:
        raise Skipped("the default start did not run, so there is nothing to state")
    plan = report.plan
    extra = gpu_runs.stated(choice, batch_size)
    with gpu_runs.torchserve(report.stores[store], plan.gpus, extra) as server:
        levels = gpu_runs.ladder(
            report.loader, server.predict_url, server.headers(), report.corpus,
            plan.levels, (plan.warmup_s, plan.seconds), server,
        )  # fmt: skip
    return {"config": extra, "by_concurrency": levels}


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
    plan = report.plan
    with litserve_peer(report.model_dir, config, ready_timeout=300) as running:
        pids = {f"litserve_{n}": pid for n, pid in enumerate(running.pids())}
        levels = gpu_runs.ladder(
            report.loader, running.url, {}, report.corpus, plan.levels,
            (plan.warmup_s, plan.seconds), pids=pids,
        )  # fmt: skip
    uvicorn = {
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
    }
    return {"config": config, "uvicorn": uvicorn, "by_concurrency": levels}


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
            served["cuda_graphs"] = gpu_runs.ladder(
                report.loader, server.predict_url, server.headers(), report.corpus, (1, 4),
                (plan.warmup_s, plan.seconds), server,
            )  # fmt: skip
    out["served"] = served
    return out


def ceiling(report: Report) -> dict[str, Any]:
    choice = report.results.get("rule") or {"workers": 1}
    return inprocess.ceiling(
        report.model_dir, report.corpus, report.plan.ceiling_sizes, report.plan.seconds,
        choice["workers"], bool(report.plan.gpus),
    )  # fmt: skip


def needs(available: bool, why: str) -> None:
    if not available:
        raise Skipped(why)


def archives(plan: Plan, model_dir: Path, root: Path) -> dict[str, Path]:
    """One store per handler setting the report serves: fp32, and bf16, tf32 and CUDA graphs
    where this machine has them."""
    variants: dict[str, dict[str, Any]] = {"fp32": {}}
    if plan.gpus or cpu_has_native_bf16():
        variants["bf16"] = {"precision": "bf16"}
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
            points = 2 * plan.sweep_span + 1
            report.run("sweep_fp32", plan.estimate("sweep", points), lambda: sweep(report, "fp32"))
            report.run("sweep_bf16", plan.estimate("sweep", points), lambda: bf16(report))
            report.run("peer", plan.estimate("peer"), lambda: peer(report))
            report.run("lone_request", 2 * plan.start_s, lambda: lone_request(report))
            report.run("bs1", plan.estimate("stated"), lambda: stated_run(report, "fp32", 1))
            report.run("tf32", plan.estimate("stated"), lambda: tf32(report))
            report.run("ceiling", plan.start_s / 2, lambda: ceiling(report))
        finally:
            loader.close()
        top = tuple(level for level in plan.levels if level >= 256) or plan.levels[-1:]
        results["bars"] = gpu_findings.bars(results, top)
        results["limits"] = gpu_findings.limits(results)
        results["seconds"] = round(time.monotonic() - began, 1)
        report.write()
        gpu_findings.plot(results, out)
    return results


def bf16(report: Report) -> dict[str, Any]:
    needs("bf16" in report.stores, "no native bf16 here (a CPU without AVX-512 BF16 or AMX)")
    return sweep(report, "bf16")


def tf32(report: Report) -> dict[str, Any]:
    needs("tf32" in report.stores, "TF32 needs a CUDA GPU of compute capability 8.0 or more")
    return stated_run(report, "tf32")


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
    args = parser.parse_args(argv)
    plan = SMOKE_PLAN if args.smoke else GPU_PLAN
    plan = replace(plan, with_compile=args.with_compile)
    if args.budget_s:
        plan = replace(plan, budget_s=args.budget_s)
    if plan.device == "cuda" and not plan.gpus:
        print("gpu-report: no CUDA GPU here; `--smoke` runs it on the CPU", file=sys.stderr)
        return 1
    command = "python -m lab gpu-report --smoke" if args.smoke else GPU_COMMAND
    results = run(plan, args.out, command)
    print(dumps({"bars": results["bars"], "limits": results["limits"]}))
    step(f"wrote {args.out / 'results.json'} and gpu.png in {results['seconds']} s")
    failed = [name for name in SECTIONS if "error" in results.get(name, {"error": "not run"})]
    if failed:
        step(f"sections that failed: {failed}")
    return 1 if failed else 0
