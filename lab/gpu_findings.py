"""What the GPU report concludes from its runs: the issue's bars, what stops each server where it
stops, and the plot.

What stops a server at a load, from what was busy meanwhile (thresholds, not a model):

- ``the GPU``: it was busy ``GPU_BUSY`` of the time or more;
- ``the host CPU``: the host's cores were ``HOST_BUSY`` busy or more (each core's share and the
  load generator's CPU seconds are recorded beside it: it shares the host);
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


def versus(run: dict[str, Any], other: dict[str, Any], clients: int) -> dict[str, Any]:
    """``run``'s median requests/s over ``other``'s at ``clients``, and the wider of their
    repeats' relative spreads ((max - min) / median)."""
    level, base = str(clients), rps(other, clients)
    value = round(rps(run, clients) / base, 3) if base else None
    return {
        "value": value,
        "spread": max(r.get(level, {}).get("rps_spread") or 0.0 for r in (run, other)),
    }


def chosen(results: dict[str, Any]) -> dict[str, Any]:
    """The default start's ladder (at the workers per GPU it chose), {} where it did not run."""
    sweep = results.get("default", {})
    return dict(sweep.get("by_workers_per_gpu", {}).get(str(sweep.get("rule_workers_per_gpu")), {}))


def bars(results: dict[str, Any], top: tuple[int, ...]) -> dict[str, Any]:
    """Every bar the run has the data for, each with its value, the ratios with the spread of
    the repeats behind them (on an H100-class GPU; on another machine they are computed all the
    same, and ``device`` says where)."""
    out: dict[str, Any] = {}
    default, runs = chosen(results), results.get("default", {}).get("by_workers_per_gpu", {})
    for clients in top if default else ():
        best = versus(default, max(runs.values(), key=lambda run: rps(run, clients)), clients)
        met = best["value"] is not None and best["value"] >= 0.9
        out[f"default_vs_best_workers_at_{clients}"] = best | {"bar": ">= 0.9", "met": met}
    if default:
        at_top = rps(default, max(top))
        out[f"default_rps_at_{max(top)}"] = _bar(at_top, ">= 15000", at_top >= 15_000)
        peer = results.get("peer", {}).get("by_concurrency", {})
        ahead = [versus(default, peer, int(c)) for c in peer if int(c) >= 32]
        if worst := min(ahead, key=lambda v: v["value"] or 0.0, default=None):
            met = all((v["value"] or 0.0) > 1 for v in ahead)
            out["default_vs_litserve_from_32"] = worst | {"bar": "> 1 at every load", "met": met}
    served = {"default": default} | results.get("lone_request", {}).get("served", {})
    for name, run in served.items():
        if (p50 := run.get("1", {}).get("p50_ms")) is not None:
            out[f"lone_p50_ms_{name}"] = _bar(p50, "<= 5", p50 <= 5)
    change = results.get("fp32", {}).get("scores_vs_cpu", {}).get("max_scores_change")
    if change is not None:
        out["fp32_vs_cpu_scores"] = _bar(change, "<= 1e-5", change <= 1e-5)
    return out


def figures(results: dict[str, Any], clients: int) -> dict[str, Any]:
    """What the bars stand on, at ``clients``: the precision the default start chose, its rate
    against ``batchSize`` 1 and against fp32 pinned (``versus``), the real tokens' share of those
    computed, and the default's top labels against fp32's."""
    default, fp32 = chosen(results), results.get("fp32", {})
    out: dict[str, Any] = {"precision": results.get("rule", {}).get("precision")}
    for name, floor in (("bs1", 8.0), ("fp32", 0.0)):
        other = results.get(name, {}).get("by_concurrency", {})
        ratio = versus(default, other, clients)
        out[f"default_vs_{name}_at_{clients}"] = ratio | (
            {"bar": f">= {floor:g}", "met": (ratio["value"] or 0.0) >= floor} if floor else {}
        )
    share = default.get(str(clients), {}).get("padding_efficiency")
    out[f"real_token_share_at_{clients}"] = _bar(share, ">= 0.85", (share or 0.0) >= 0.85)
    agreement = fp32.get("default_top_label_agreement")
    met = agreement is not None and agreement >= 0.995
    return out | {"top_label_agreement_vs_fp32": _bar(agreement, ">= 0.995", met)}


def limits(results: dict[str, Any]) -> dict[str, Any]:
    """What stops the default start at each load."""
    workers = results.get("rule", {}).get("workers", 0)
    return {"default": {c: limit(level, workers) for c, level in chosen(results).items()}}


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
        left.axhline(ceiling, linestyle="--", color="grey", label="in-process ceiling")
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
    sweep, runs = results.get("default", {}), {}
    for per_gpu, run in sweep.get("by_workers_per_gpu", {}).items():
        chosen = " (the rule)" if per_gpu == str(sweep["rule_workers_per_gpu"]) else ""
        runs[f"default {per_gpu} workers/GPU{chosen}"] = run
    for name in ("fp32", "bs1", "tf32", "peer"):
        if "by_concurrency" in results.get(name, {}):
            runs[name if name != "peer" else "LitServe like ours"] = results[name]["by_concurrency"]
    return runs
