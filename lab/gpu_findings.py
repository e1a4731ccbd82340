"""What the GPU report concludes from its runs: the issue's bars, what stops each server where it
stops, and the plot.

What stops a server at a load, from what was busy meanwhile (thresholds, not a model):

- ``the GPU``: it was busy ``GPU_BUSY`` of the time or more;
- ``the host CPU``: the host's cores were ``HOST_BUSY`` busy or more (the load generator's
  share is reported beside it: it shares the host);
- ``tokenization`` or ``the workers' Python``: each worker used ``WORKER_BUSY`` of a core or
  more (a worker's CPU side is serial), tokenization when it was half of their time or more;
- ``the frontend``: none of those; TorchServe's frontend (HTTP, queue, batching) is what is left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.report import pyplot

GPU_BUSY = 85.0
HOST_BUSY = 90.0
WORKER_BUSY = 0.85


def limit(level: dict[str, Any], workers: int) -> str:
    """What stops the server at one measured level (see the module's docstring)."""
    if (level.get("gpu_busy_pct") or 0.0) >= GPU_BUSY:
        return "the GPU"
    if level.get("host_cpu_busy_pct", 0.0) >= HOST_BUSY:
        return "the host CPU"
    worker_cores = level.get("cores", {}).get("workers", 0.0)
    if workers and worker_cores / workers >= WORKER_BUSY:
        busy_s = worker_cores * level.get("seconds", 0.0)
        if busy_s and level.get("tokenize_s", 0.0) >= busy_s / 2:
            return "tokenization"
        return "the workers' Python"
    return "the frontend"


def _bar(value: float | None, bar: str, met: bool) -> dict[str, Any]:
    return {"value": value, "bar": bar, "met": met}


def rps(run: dict[str, Any], clients: int) -> float:
    level = run.get(str(clients), {})
    return 0.0 if level.get("errors") else float(level.get("rps", 0.0))


def sweep_bars(name: str, sweep: dict[str, Any], top: tuple[int, ...]) -> dict[str, Any]:
    """The rule's workers per GPU within 0.9 of the sweep's best at the top loads."""
    bars = {}
    runs, chosen = sweep["by_workers_per_gpu"], str(sweep["rule_workers_per_gpu"])
    for clients in top:
        best = max(rps(run, clients) for run in runs.values())
        ratio = round(rps(runs[chosen], clients) / best, 3) if best else None
        met = ratio is not None and ratio >= 0.9
        bars[f"{name}_default_vs_best_workers_at_{clients}"] = _bar(ratio, ">= 0.9", met)
    return bars


def bars(results: dict[str, Any], top: tuple[int, ...]) -> dict[str, Any]:
    """Every bar the run has the data for, each with its value (on an H100-class GPU; on
    another machine they are computed all the same, and ``device`` says where)."""
    out: dict[str, Any] = {}
    for name in ("fp32", "bf16"):
        sweep = results.get(f"sweep_{name}", {})
        if "by_workers_per_gpu" in sweep:
            out |= sweep_bars(name, sweep, top)
    bf16 = results.get("sweep_bf16", {})
    if "by_workers_per_gpu" in bf16:
        default = bf16["by_workers_per_gpu"][str(bf16["rule_workers_per_gpu"])]
        best = max(rps(default, clients) for clients in top)
        out["bf16_default_rps"] = _bar(best, ">= 10000", best >= 10_000)
    fp32 = results.get("sweep_fp32", {})
    if "by_workers_per_gpu" in fp32:
        default = fp32["by_workers_per_gpu"][str(fp32["rule_workers_per_gpu"])]
        p50 = default.get("1", {}).get("p50_ms")
        if p50 is not None:
            out["fp32_default_p50_ms_at_1"] = _bar(p50, "<= 6", p50 <= 6)
        peer = results.get("peer", {}).get("by_concurrency", {})
        ahead = {c: round(rps(default, int(c)) / max(rps(peer, int(c)), 1e-9), 2) for c in peer}
        ahead = {c: ratio for c, ratio in ahead.items() if int(c) >= 32}
        if ahead:
            worst = min(ahead.values())
            out["default_vs_litserve_from_32"] = _bar(worst, "> 1 at every load", worst > 1)
    lone = results.get("lone_request", {}).get("served", {})
    for capture, run in lone.items():
        p50 = run.get("1", {}).get("p50_ms")
        if p50 is not None:
            out[f"lone_p50_ms_capture_{capture}"] = _bar(p50, "<= 6", p50 <= 6)
    scores = results.get("scores", {})
    if "max_scores_change" in scores:
        change = scores["max_scores_change"]
        out["served_fp32_vs_cpu_scores"] = _bar(change, "<= 1e-5", change <= 1e-5)
    return out


def limits(results: dict[str, Any]) -> dict[str, Any]:
    """For each default server (and the peer), what stops it at each load."""
    out: dict[str, Any] = {}
    for name in ("fp32", "bf16"):
        sweep = results.get(f"sweep_{name}", {})
        if "by_workers_per_gpu" in sweep:
            per_gpu = sweep["rule_workers_per_gpu"]
            runs = sweep["by_workers_per_gpu"][str(per_gpu)]
            workers = per_gpu * max(results["gpus"], 1)
            out[name] = {clients: limit(level, workers) for clients, level in runs.items()}
    return out


def plot(results: dict[str, Any], out: Path) -> None:
    """``gpu.png``: requests/s and p50 against clients for every served run."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    colors = plt.get_cmap("tab20").colors  # a color per run: the default cycle has 10
    for number, (name, runs) in enumerate(served_runs(results).items()):
        levels = sorted(runs, key=int)
        x = [int(level) for level in levels]
        style = {"marker": "o", "label": name, "color": colors[number % len(colors)]}
        left.plot(x, [runs[level]["rps"] for level in levels], **style)
        right.plot(x, [runs[level]["p50_ms"] for level in levels], **style)
    ceiling = results.get("ceiling", {}).get("texts_per_s")
    if ceiling:
        left.axhline(ceiling, linestyle="--", color="grey", label="in-process ceiling fp32")
    for axes, label in ((left, "requests/s"), (right, "p50 latency (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrent clients")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
    right.set_yscale("log")
    left.legend(fontsize=7)
    machine = results["machine"]
    figure.suptitle(f"{results['model']['shape']} on {machine.get('gpu') or machine['cpu_model']}")
    figure.tight_layout()
    figure.savefig(out / "gpu.png", dpi=110)
    plt.close(figure)


def served_runs(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every ladder of the report by a name for the plot's legend."""
    runs: dict[str, dict[str, Any]] = {}
    for name in ("fp32", "bf16"):
        sweep = results.get(f"sweep_{name}", {})
        for per_gpu, run in sweep.get("by_workers_per_gpu", {}).items():
            chosen = " (the rule)" if per_gpu == str(sweep["rule_workers_per_gpu"]) else ""
            runs[f"{name} {per_gpu} workers/GPU{chosen}"] = run
    for name in ("bs1", "tf32", "peer"):
        if "by_concurrency" in results.get(name, {}):
            runs[name if name != "peer" else "LitServe like ours"] = results[name]["by_concurrency"]
    return runs
