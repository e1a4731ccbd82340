"""The GPU report (``make gpu-report``): the served model on one machine's GPU, every run the issue
of the GPU bars asks for, in one call that fits one lent device call.

On a bert-base-shaped BERT (random weights, seeded; the default model's tokenizer) it runs, in
this order (the bars' runs first, so a run cut short by its budget keeps them):

1. ``sweep_fp32``: the default start (fp32; the rule picks workers per GPU, batch size, queue),
   then workers per GPU from the rule's choice - 2 to + 2, rescaled in place through the
   management API, each at every load of the ladder; on the default, the served scores
   against this host's CPU (``scores``);
2. ``sweep_bf16``: the same for ``precision: bf16``, started by the rule on its own;
3. ``peer``: LitServe running the handler's own tokenize and forward, configured like the
   default (its workers per device, ``max_batch_size``, ``batch_timeout``; its own count of
   HTTP processes), at every load;
4. ``lone_request``: a lone text's tokenize + forward in process, eager against the captured
   forward (``handler.capture``: ``cuda_graphs``; ``compile`` with ``--with-compile``), and
   served at 1 and 4 clients with ``capture: cuda_graphs`` (on a GPU only);
5. ``bs1`` (batchSize 1) and ``tf32``: stated like the default (no measuring at start), at every
   load;
6. ``ceiling``: the in-process ceiling, as many single-threaded processes as the rule's workers.

Each load level is a closed loop of the load generator (``lab.load``) spread over several
processes (``lab.gpu_load``), with the GPU's busy share (NVML or ``nvidia-smi``), the host's,
and the cores of the frontend, the workers and the load generator; ``lab.gpu_findings`` turns
them into the bars and what stops each server. Writes ``results.json`` (rewritten after every
run, so a cut-short call leaves what it measured) and ``gpu.png`` into ``--out``.

Budget of the GPU call (one device call of at most 8 minutes = 480 s): ``device-setup.sh`` and
``scripts/gpu_device_extra.sh`` (the carried wheels installed, Java and LitServe unpacked) about
30 s, so the report's own budget is ``GPU_PLAN.budget_s`` = 400 s, leaving 50 s.

- model and archives: about 20 s (bert-base saved, four stored .mar files);
- starts: two by the rule, each measuring the model at start, about 40 s each; three stated
  (bs1, tf32, capture) about 20 s each; LitServe about 25 s; 8 rescalings about 5 s each:
  about 205 s;
- ladders: 6 levels x (0.25 s warm-up + 1 s measured + 0.5 s of overhead) = 10.5 s each, for
  5 + 5 sweep points, bs1, tf32 and LitServe: 13 x 10.5 = about 137 s, plus 2 levels served
  captured: about 4 s;
- scores, the lone request (two fresh processes) and the ceiling: about 45 s.

That is about 410 s of estimates against 400: the report checks, before each run, that its
estimate (``Plan.estimate``) fits in what is left, else records it as skipped with the reason,
and always writes what it has. ``results.json``'s ``phases`` holds each run's real seconds, so
the first GPU call corrects these estimates.

The smoke form (``--smoke``, CI) runs every section on the CPU with a tiny model (one layer of
128), 1 and 2 clients, a sweep of +- 1; runs the hardware lacks (bf16 without native bf16,
tf32 and CUDA graphs without CUDA) are written as skipped with the reason. Its time is mostly
starts: two TorchServe starts, LitServe's, the rescalings and four fresh Python processes that
import torch (the load processes, the ceiling's, the lone request's); ``seconds`` in its
``results.json`` says how long it took. Its budget (``SMOKE_PLAN.budget_s``) is only a guard:
nothing in it is skipped for time.
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
        model_dir = gpu_runs.build_model(
            gpu_runs.tokenizer_source(), Path(temp, "model"), plan.shape
        )
        results["model"] = {"shape": plan.shape, "layers_x_width": [gpu_runs.MODEL_SHAPES[plan.shape][k] for k in ("num_hidden_layers", "hidden_size")], "weights": "random, seed 0"}  # fmt: skip
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
