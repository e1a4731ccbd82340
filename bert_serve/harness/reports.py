"""What bench and tune conclude from their runs: the benchmark's ratios, the tuner's
recommendation, and their plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bert_serve.harness.config import models_entry


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / max(denominator, 1e-9), 2)


def _top_level(scenarios: dict[str, Any]) -> str:
    """The highest concurrency the batched and the batch-size-1 scenarios share."""
    batched = scenarios["torchserve_batched"]["by_concurrency"]
    bs1 = scenarios.get("torchserve_bs1", {}).get("by_concurrency", batched)
    return str(max(int(level) for level in batched if level in bs1))


def bench_ratios(results: dict[str, Any]) -> dict[str, Any]:
    """The bars of the benchmark issue, computed from this run only."""
    scenarios = results["scenarios"]
    ceiling = results["ceiling"]
    batched_scenario = scenarios["torchserve_batched"]
    batched = batched_scenario["by_concurrency"]
    top = _top_level(scenarios)
    rps = batched[top]["rps"]
    out: dict[str, Any] = {"at_concurrency": int(top)}
    if "torchserve_bs1" in scenarios:
        out["batched_vs_bs1"] = _ratio(
            rps, scenarios["torchserve_bs1"]["by_concurrency"][top]["rps"]
        )
    out["served_vs_ceiling"] = round(rps / ceiling["texts_per_s"], 2)
    if "litserve" in scenarios:
        out["batched_vs_litserve"] = _ratio(
            rps, scenarios["litserve"]["by_concurrency"][top]["rps"]
        )
    lists = batched_scenario.get("client_lists")
    if lists:
        best_lists = max(run["texts_per_s"] for run in lists)
        out["client_lists_vs_single_texts"] = round(best_lists / rps, 2)
        out["client_lists_vs_ceiling"] = round(best_lists / ceiling["texts_per_s"], 2)
    out["padding_efficiency"] = batched[top].get("padding_efficiency")
    out["errors_batched"] = sum(level["errors"] for level in batched.values())
    return out | _p99_bound(results)


def _p99_bound(results: dict[str, Any]) -> dict[str, Any]:
    """p99 at 8 clients against maxBatchDelay + 3 full in-process batches."""
    batched = results["scenarios"]["torchserve_batched"]
    if "8" not in batched["by_concurrency"]:
        return {}
    config = batched["config"]
    by_size = results["ceiling"]["by_batch_size"]
    full_batch_ms = by_size.get(str(config["batchSize"]), {}).get("batch_ms_p50")
    if full_batch_ms is None:
        return {}
    return {
        "p99_ms_at_8": batched["by_concurrency"]["8"]["p99_ms"],
        "p99_bound_ms_at_8": round(config["maxBatchDelay"] + 3 * full_batch_ms, 1),
    }


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bench(results: dict[str, Any], out: Path) -> None:
    """``throughput.png`` and ``latency.png``: each scenario against concurrency."""
    plt = pyplot()
    for metric, ylabel, filename in (
        ("rps", "requests/s", "throughput.png"),
        ("p99_ms", "p99 latency (ms)", "latency.png"),
    ):
        figure, axes = plt.subplots(figsize=(7, 4.2))
        for name, scenario in results["scenarios"].items():
            levels = sorted(scenario["by_concurrency"], key=int)
            values = [scenario["by_concurrency"][level][metric] for level in levels]
            axes.plot([int(level) for level in levels], values, marker="o", label=name)
        if metric == "rps":
            axes.axhline(
                results["ceiling"]["texts_per_s"],
                linestyle="--",
                color="grey",
                label=f"in-process ceiling (batch {results['ceiling']['best_batch_size']})",
            )
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrent clients")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{ylabel} vs concurrency ({results['machine']['cpus']} CPU cores)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(out / filename, dpi=110)
        plt.close(figure)


def recommend_across_loads(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The config whose worst ratio to the best requests/s at each load is the highest.

    Every run has ``by_concurrency`` at the same levels. A run with errors at some level
    scores 0 there. In a closed loop, requests/s at a level fixes the mean latency
    (clients / requests/s), so the ratio covers both."""
    levels = sorted({level for run in runs for level in run["by_concurrency"]}, key=int)

    def rps(run: dict[str, Any], level: str) -> float:
        measured = run["by_concurrency"][level]
        return 0.0 if measured["errors"] else float(measured["rps"])

    best_at = {level: max(rps(run, level) for run in runs) for level in levels}
    scored = []
    for run in runs:
        ratios = {level: _ratio(rps(run, level), best_at[level]) for level in levels}
        scored.append({"name": run["name"], "config": run["config"], "ratios": ratios})
    ranking = sorted(
        scored,
        key=lambda item: (min(item["ratios"].values()), sum(item["ratios"].values())),
        reverse=True,
    )
    best = ranking[0]
    return best | {
        "worst_ratio": min(best["ratios"].values()),
        "best_rps_at": best_at,
        "ranking": [
            {"name": item["name"], "worst_ratio": min(item["ratios"].values())} for item in ranking
        ],
    }


def tune_snippet(best: dict[str, Any], loads: list[int]) -> str:
    """The recommendation as lines to paste into config/config.properties."""
    config = best["config"]
    lines = [
        f"# Recommended by `make tune` over {', '.join(map(str, loads))} concurrent clients:",
        f"# {best['name']}, at least {best['worst_ratio']:.2f}x the best config's requests/s at every load",
        "# Paste into config/config.properties (replacing the models= line).",
        f"models={models_entry(config['batch_size'], config['delay_ms'], config['workers'])}",
        f"# and in config/model-config.yaml: handler.torch_threads: {config['threads']} (then make package)",
    ]
    return "\n".join(lines) + "\n"


def plot_tune(runs: list[dict[str, Any]], best: dict[str, Any], out: Path) -> None:
    """``tune.png``: requests/s against clients per config, and each config's ratio to the
    best at each load, with the recommendation drawn thick."""
    plt = pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    for run in runs:
        levels = sorted(run["by_concurrency"], key=int)
        width = 3 if run["name"] == best["name"] else 1.2
        x = [int(level) for level in levels]
        top.plot(
            x,
            [run["by_concurrency"][level]["rps"] for level in levels],
            marker="o",
            linewidth=width,
            label=run["name"],
        )
        bottom.plot(
            x,
            [run["by_concurrency"][level]["rps"] / best["best_rps_at"][level] for level in levels],
            marker="o",
            linewidth=width,
            label=run["name"],
        )
    top.set_ylabel("requests/s")
    top.set_title(
        "Each config at each load (b=batch size, d=maxBatchDelay ms, w=workers, t=threads)"
    )
    bottom.set_ylabel("ratio to the best config at that load")
    bottom.set_xlabel("concurrent clients")
    bottom.set_xscale("log", base=2)
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
    top.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(out / "tune.png", dpi=110)
    plt.close(figure)
