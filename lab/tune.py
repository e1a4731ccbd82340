"""``make tune``: the batching config close to the best at every load, not at one guessed load.

Every candidate (batch size, maxBatchDelay, workers x torch threads) runs on its own TorchServe,
all at once, and at each load each gets the benchmark's corpus in turn (``lab.load.interleaved``).
A candidate's score is its worst ratio, over the loads, to the best requests/s of any candidate
at that load; the recommendation is the best score. Writes ``results.json``, ``tune.png`` and
``recommended.properties`` into ``--out``.

    python -m lab tune --candidates b1d0w2t1 b16d2w2t1 --loads 1 32 --seconds 4
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from bert_serve_server.archive import package_variant
from bert_serve_server.config import ROOT, models_entry
from bert_serve_server.probe import read_machine

from lab.corpus import make_corpus
from lab.load import Loads, endpoint, interleaved, servers
from lab.report import now, pyplot, tool_parser, write_json

CANDIDATE = re.compile(r"b(\d+)d(\d+)w(\d+)t(\d+)")


def default_candidates(cores: float) -> list[str]:
    """The default layout (one worker per core, one torch thread each) at batch sizes 1 to 32
    and two batch delays, then the same cores as half the workers x 2 threads and as one
    worker with them all, batching as the default does."""
    workers = max(1, math.floor(cores))
    names = [
        f"b{b}d{d}w{workers}t1" for b, d in ((1, 0), (4, 1), (8, 1), (16, 1), (16, 2), (32, 2))
    ]
    for layout in (f"w{max(1, workers // 2)}t2", f"w1t{workers}"):
        if workers > 1 and f"b16d1{layout}" not in names:
            names.append(f"b16d1{layout}")
    return names


def parse_candidate(name: str) -> dict[str, int]:
    """``b16d2w2t1``: batch size 16, maxBatchDelay 2 ms, 2 workers x 1 torch thread."""
    match = CANDIDATE.fullmatch(name)
    if not match:
        raise argparse.ArgumentTypeError(f"{name!r} is not like b16d2w2t1")
    batch_size, delay_ms, workers, threads = map(int, match.groups())
    return {"batch_size": batch_size, "delay_ms": delay_ms, "workers": workers, "threads": threads}


def candidate_name(config: dict[str, int]) -> str:
    return f"b{config['batch_size']}d{config['delay_ms']}w{config['workers']}t{config['threads']}"


def sweep(configs: list[dict[str, int]], corpus: list[str], loads: Loads) -> list[dict[str, Any]]:
    """Every config on its own server (from a store whose .mar has its threads), all running
    at once and measured in turn at each load."""
    with tempfile.TemporaryDirectory(prefix="tune-stores-") as stores:
        for threads in {config["threads"] for config in configs}:
            changes = {"torch_threads": threads}
            package_variant(Path(stores) / f"threads{threads}", handler_changes=changes)
        overrides = {
            candidate_name(config): {
                "model_store": str(Path(stores) / f"threads{config['threads']}"),
                "models": models_entry(config["batch_size"], config["delay_ms"], config["workers"]),
            }
            for config in configs
        }
        print(f"[tune] starting {len(configs)} servers", file=sys.stderr)
        with servers(overrides) as running_servers:
            endpoints = [endpoint(name, item["server"]) for name, item in running_servers.items()]
            measured = interleaved(endpoints, corpus, loads)
    return [
        {"name": candidate_name(c), "config": c, "by_concurrency": measured[candidate_name(c)]}
        for c in configs
    ]


def recommend_across_loads(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The config whose worst ratio to the best requests/s at each load is the highest. A run
    with errors at a level scores 0 there. In a closed loop, requests/s at a level fixes the
    mean latency (clients / requests/s), so the ratio covers both."""
    levels = sorted({level for run in runs for level in run["by_concurrency"]}, key=int)

    def rps(run: dict[str, Any], level: str) -> float:
        measured = run["by_concurrency"][level]
        return 0.0 if measured["errors"] else float(measured["rps"])

    best_at = {level: max(rps(run, level) for run in runs) for level in levels}
    scored = [
        {"name": run["name"], "config": run["config"]}
        | {
            "ratios": {
                level: round(rps(run, level) / max(best_at[level], 1e-9), 2) for level in levels
            }
        }
        for run in runs
    ]
    for item in scored:
        item["worst_ratio"] = min(item["ratios"].values())
    ranking = sorted(
        scored, key=lambda i: (i["worst_ratio"], sum(i["ratios"].values())), reverse=True
    )
    ranked = [{"name": item["name"], "worst_ratio": item["worst_ratio"]} for item in ranking]
    return ranking[0] | {"best_rps_at": best_at, "ranking": ranked}


def snippet(best: dict[str, Any], loads: list[int]) -> str:
    """The recommendation as lines to paste into config/config.properties."""
    config = best["config"]
    entry = models_entry(config["batch_size"], config["delay_ms"], config["workers"])
    return (
        f"# Recommended by `make tune` over {', '.join(map(str, loads))} concurrent clients:\n"
        f"# {best['name']}, at least {best['worst_ratio']:.2f}x the best config's requests/s at every load\n"
        "# Paste into config/config.properties (replacing the models= line).\n"
        f"models={entry}\n"
        f"# and in config/model-config.yaml: handler.torch_threads: {config['threads']} (then make package)\n"
    )


def plot(runs: list[dict[str, Any]], best: dict[str, Any], out: Path) -> None:
    """``tune.png``: requests/s against clients per config, and each config's ratio to the best
    at each load, the recommendation drawn thick."""
    plt = pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    for run in runs:
        levels = sorted(run["by_concurrency"], key=int)
        width = 3 if run["name"] == best["name"] else 1.2
        style = {"marker": "o", "linewidth": width, "label": run["name"]}
        rps = [run["by_concurrency"][level]["rps"] for level in levels]
        top.plot([int(level) for level in levels], rps, **style)
        ratios = [r / best["best_rps_at"][level] for r, level in zip(rps, levels, strict=True)]
        bottom.plot([int(level) for level in levels], ratios, **style)
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


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("tune", __doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "tune")
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--seconds", type=float, default=5, help="measured seconds per load")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--candidates", type=parse_candidate, nargs="+")
    args = parser.parse_args(argv)
    candidates = args.candidates or [
        parse_candidate(n) for n in default_candidates(read_machine(0).cores)
    ]
    loads = Loads(args.loads, args.seconds, args.warmup)
    started = now()
    runs = sweep(candidates, make_corpus(), loads)
    best = recommend_across_loads(runs)
    results = {
        "command": " ".join(["python -m lab tune", *(sys.argv[1:] if argv is None else argv)]),
        "started": started,
        "loads": args.loads,
        "seconds_per_load": args.seconds,
        "runs": runs,
        "recommended": best,
    }
    write_json(args.out / "results.json", results)
    (args.out / "recommended.properties").write_text(snippet(best, args.loads))
    plot(runs, best, args.out)
    print(snippet(best, args.loads))
    return 0
