"""``make bench``: the served model against batch size 1, its in-process ceiling and LitServe, in
one run, on one corpus (docs/bench/README.md reads ``results.json`` and ``serving.png``).

- ``ceiling``: tokenization + forward with no HTTP, in the default's precision, in as many
  single-threaded processes as the default config has workers, at each batch size, before and after the served runs (the better
  of the two per batch size);
- ``precision``: the precision the default start settles ``auto`` on (``probe.measured_precision``,
  shared with the start through the measurement cache), and where it is not fp32, fp32 against
  it through the handler's classify (``lab.compare``) on the corpus and the held-out reviews;
- ``scenarios``: TorchServe with the default config, batch size 1 and fp32 pinned, LitServe out of the
  box and configured like the default's settings in force, measured in turn at each load
  (``lab.load.interleaved``); then, on the default server, where the CPU goes at 32 clients and
  the client's list requests.

``--smoke`` keeps the ceiling and the default server, a few seconds each.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bert_serve_server import probe, rules
from bert_serve_server.archive import DEFAULT_ARCHIVE, DEFAULT_MODEL_DIR, package_variant
from bert_serve_server.config import ROOT, models_entry
from bert_serve_server.control import Server

from bert_serve.client import Client
from handler.inference import classify
from handler.model import load_model
from lab import inprocess
from lab.compare import compare_precision, config_settings
from lab.corpus import corpus_stats, make_corpus
from lab.load import Endpoint, Loads, cores_used, endpoint, interleaved, run_texts, servers
from lab.load import server_processes as processes
from lab.peer import OUT_OF_THE_BOX, PEERS, configured_like, litserve_peer
from lab.report import describe, dumps, now, pyplot, tool_parser, write_json
from training import Recipe, examples

SERVER_KEYS = ("config", "startup_s", "worker_memory")


@dataclass(frozen=True)
class Plan:
    """The model, seconds per load level, the smoke form or not, and the device (``cpu`` or
    ``cuda``: the served workers and the in-process runs alike)."""

    model_dir: Path
    seconds: float
    warmup: float
    smoke: bool = False
    device: str = "cpu"
    precision: str = "fp32"
    """What the default start settles ``auto`` on here (``chosen_precision``)."""

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


def step(title: str) -> None:
    print(f"[bench] {title}", file=sys.stderr)


def chosen_precision(gpus: int) -> str:
    """The precision the default start settles ``auto`` on for the default archive, measured
    once into the measurement cache (set for the run where it is not), so the start takes the
    same answer."""
    os.environ.setdefault(probe.CACHE_ENV, tempfile.mkdtemp(prefix="bench-measured-"))
    mtime_ns = DEFAULT_ARCHIVE.stat().st_mtime_ns
    return probe.measured_precision(str(DEFAULT_ARCHIVE), mtime_ns, gpus).precision


def torchserve_configs(plan: Plan, store: Path) -> dict[str, dict[str, str]]:
    """The default; batch size 1 and fp32 pinned (packaged into ``store``) unless in the
    smoke form."""
    on_device = {"number_of_gpu": str(plan.gpus)}
    configs: dict[str, dict[str, str]] = {"torchserve_batched": on_device}
    if not plan.smoke:
        configs["torchserve_bs1"] = on_device | {"models": models_entry(batch_size=1)}
        package_variant(store, handler_changes={"precision": "fp32"}, model_dir=plan.model_dir)
        configs["torchserve_fp32"] = on_device | {"model_store": str(store)}
    return configs


@contextmanager
def peers(plan: Plan, configs: dict[str, dict[str, float]]) -> Iterator[list[Endpoint]]:
    """The LitServe peers (none in the smoke form or without LitServe), until the block ends."""
    with ExitStack() as stack:
        if plan.smoke or importlib.util.find_spec("litserve") is None:
            configs = {}
        endpoints = []
        for name, config in configs.items():
            step(f"starting the LitServe peer {name}")
            peer = stack.enter_context(litserve_peer(plan.model_dir, config))
            endpoints.append(Endpoint(name, peer.url, {}, None, peer.process_group))
        yield endpoints


def served(plan: Plan, corpus: list[str]) -> dict[str, Any]:
    """Every server measured in turn at each load; then, the peers stopped, the CPU split and
    the client's list requests on the default server."""
    with tempfile.TemporaryDirectory(prefix="bench-fp32-") as store, ExitStack() as stack:
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
            name: {key: item[key] for key in SERVER_KEYS}
            | {"precision": served_precision(item["server"]), "by_concurrency": measured[name]}
            for name, item in started.items()
        }
        for peer, peer_config in peer_configs.items():
            if peer in measured:
                scenarios[peer] = {"config": peer_config, "by_concurrency": measured[peer]}
        default = scenarios["torchserve_batched"]
        if not plan.smoke:
            step("where the CPU goes on the default server at 32 clients")
            default["cpu_split"] = cpu_split(default_server, corpus, 32, plan.loads)
        step("client list requests on the default server")
        texts = corpus[: 64 if plan.smoke else 1500]
        default["client_lists"] = [client_lists(default_server, texts, *r) for r in plan.list_runs]
    return scenarios


def served_precision(server: Server) -> str:
    """The precision a server's model runs in: its start's choice, else its config's."""
    (entry,) = (
        v for versions in (server.in_force or {})["models"].values() for v in versions.values()
    )
    return str(entry.get("precision", "as its archive states"))


def cpu_split(server: Server, corpus: list[str], level: int, loads: Loads) -> dict[str, Any]:
    """The cores the frontend, each worker and this load generator use at ``level`` clients."""
    url, headers = server.predict_url, server.headers()
    run_texts(url, headers, corpus, level, loads.warmup, "cpu split warm-up")
    with cores_used(processes(server)) as cores:
        result = run_texts(url, headers, corpus, level, loads.seconds, "cpu split")
    total = round(sum(cores.values()), 3)
    return {"concurrency": level, "rps": result["rps"], "cores": cores, "cores_total": total}


def client_lists(
    server: Server, texts: list[str], chunk_size: int, concurrency: int
) -> dict[str, Any]:
    """Texts/s of the Python client's ``classify_many`` over ``texts``, after one round."""
    client = Client(server.inference_url, token=server.key("inference"))
    options = {"chunk_size": chunk_size, "concurrency": concurrency}
    client.classify_many(texts[: chunk_size * concurrency], **options)
    start = time.perf_counter()
    results = client.classify_many(texts, **options)
    elapsed = time.perf_counter() - start
    return options | {
        "texts": len(texts),
        "seconds": round(elapsed, 2),
        "texts_per_s": round(len(texts) / elapsed, 1),
        "errors": sum(not result.ok for result in results),
    }


def ceiling_processes(model_dir: Path, gpus: int) -> int:
    """The workers the default config gets here (the ceiling runs as many processes)."""
    if gpus:
        settings = config_settings()
        loaded = load_model(model_dir, settings, 0)
        load = probe.measure_device_load(loaded, settings, max(rules.BATCH_SIZES))
        return rules.workers_for(probe.read_machine(gpus), rules.GPU_WORKER_HOST_BYTES, load)[0]
    weights = sum(path.stat().st_size for path in model_dir.glob("*.safetensors"))
    worker_bytes = weights + rules.UNMEASURED_WORKER_OVERHEAD_BYTES  # a folder: nothing measured
    return rules.workers_for(probe.read_machine(gpus), worker_bytes)[0]


def run(plan: Plan, corpus: list[str]) -> dict[str, Any]:
    """Ceiling, fp32 against the default's precision, the served runs, the ceiling again."""
    workers = ceiling_processes(plan.model_dir, plan.gpus)
    sizes, seconds = ([1, 16], 1) if plan.smoke else ([1, 8, 16, 32], 4)

    def ceiling() -> dict[str, Any]:
        return inprocess.ceiling(
            plan.model_dir, corpus, sizes, seconds, workers, bool(plan.gpus), plan.precision
        )

    step(f"in-process ceiling in {plan.precision}, first pass")
    first_pass = ceiling()
    results: dict[str, Any] = {"default_precision": plan.precision}
    if not plan.smoke and plan.precision != "fp32":
        step(f"fp32 vs {plan.precision} on the corpus and the held-out reviews (in-process)")
        gpu_id = 0 if plan.gpus else None
        results["precision"] = compare_precision(
            plan.model_dir, corpus, plan.precision, config_settings(), seconds=0, gpu_id=gpu_id
        ) | {"held_out_accuracy": held_out_accuracy(plan, ("fp32", plan.precision))}
    scenarios = served(plan, corpus)
    step("in-process ceiling, second pass")
    return results | {"ceiling": inprocess.best_of(first_pass, ceiling()), "scenarios": scenarios}


def held_out_accuracy(plan: Plan, precisions: tuple[str, ...]) -> dict[str, float]:
    """The share of the held-out reviews (never trained on) each precision labels right."""
    reviews = examples(Recipe())[1]
    texts = [text for text, _ in reviews]
    settings, gpu_id = config_settings(), 0 if plan.gpus else None
    accuracy = {}
    for precision in precisions:
        loaded = load_model(plan.model_dir, replace(settings, precision=precision), gpu_id)
        predicted = [
            p.label
            for start in range(0, len(texts), 16)
            for p in classify(loaded, texts[start : start + 16], settings.max_length,
                              loaded.max_batch_tokens)[0]
        ]  # fmt: skip
        right = sum(
            loaded.labels[label] == got for (_, label), got in zip(reviews, predicted, strict=True)
        )
        accuracy[precision] = round(right / len(reviews), 4)
    return accuracy


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / max(denominator, 1e-9), 2)


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's ratios at the highest load the default and batch size 1 share, and its
    bars, from this run only."""
    scenarios, ceiling = results["scenarios"], results["ceiling"]
    default = scenarios["torchserve_batched"]
    batched = default["by_concurrency"]
    bs1 = scenarios.get("torchserve_bs1", {}).get("by_concurrency", batched)
    top = str(max(int(level) for level in batched if level in bs1))
    rps = batched[top]["rps"]
    out: dict[str, Any] = {"at_concurrency": int(top)}
    if "torchserve_bs1" in scenarios:
        out["batched_vs_bs1"] = _ratio(rps, bs1[top]["rps"])
    out["served_vs_ceiling"] = round(rps / ceiling["texts_per_s"], 2)
    for peer in PEERS:
        if peer in scenarios:
            out[f"batched_vs_{peer}"] = _ratio(rps, scenarios[peer]["by_concurrency"][top]["rps"])
    if default.get("client_lists"):
        best_lists = max(run["texts_per_s"] for run in default["client_lists"])
        out["client_lists_vs_single_texts"] = round(best_lists / rps, 2)
        out["client_lists_vs_ceiling"] = round(best_lists / ceiling["texts_per_s"], 2)
    out["padding_efficiency"] = batched[top].get("padding_efficiency")
    out["errors_batched"] = sum(level["errors"] for level in batched.values())
    if "8" in batched:
        full_ms = ceiling["by_batch_size"].get(str(default["config"]["batchSize"]), {})
        if "batch_ms_p50" in full_ms:
            bound = default["config"]["maxBatchDelay"] + 3 * full_ms["batch_ms_p50"]
            out |= {"p99_ms_at_8": batched["8"]["p99_ms"], "p99_bound_ms_at_8": round(bound, 1)}
    modes = {
        name: {
            "startup_s": scenario["startup_s"],
            "worker_rss_mb": round(sum(m["rss_mb"] for m in memory) / len(memory), 1),
            "worker_uss_mb": round(sum(m["uss_mb"] for m in memory) / len(memory), 1),
        }
        for name, scenario in scenarios.items()
        if (memory := scenario.get("worker_memory"))
    }
    return out | {"modes": modes, "bars": bars(results)}


def bar(value: float, needed: str) -> dict[str, Any]:
    """A bar's value, the bar as the report shows it (an operator and a number) and whether
    the value meets it."""
    op, limit = needed.split()
    met = {">=": value >= float(limit), "<=": value <= float(limit), ">": value > float(limit)}
    return {"value": value, "bar": needed, "met": met[op]}


def level(scenarios: dict[str, Any], name: str, clients: int) -> Any:
    return scenarios.get(name, {}).get("by_concurrency", {}).get(str(clients))


def bars(results: dict[str, Any]) -> dict[str, Any]:
    """The bars this run has the scenarios for, each with its value: the default against batch
    size 1, bf16, the ceiling (>= 0.8 at the batch size the server forms at 32 clients, >= 0.75
    of the best) and each LitServe peer."""
    scenarios, out = results["scenarios"], {}
    for clients, floor in ((1, 0.9), (8, 0.95), (32, 1.4)):
        default = level(scenarios, "torchserve_batched", clients)
        bs1 = level(scenarios, "torchserve_bs1", clients)
        if default and bs1:
            ratio = _ratio(default["rps"], bs1["rps"])
            out[f"default_vs_bs1_rps_at_{clients}"] = bar(ratio, f">= {floor}")
            if clients == 1:
                extra = round(default["p50_ms"] - bs1["p50_ms"], 1)
                out["default_p50_minus_bs1_ms_at_1"] = bar(extra, "<= 5")
    if results.get("default_precision", "fp32") != "fp32":
        for clients, floor in ((1, 0.95), (32, 1.5)):
            default, exact = (
                level(scenarios, name, clients)
                for name in ("torchserve_batched", "torchserve_fp32")
            )
            if default and exact:
                ratio = _ratio(default["rps"], exact["rps"])
                out[f"default_vs_fp32_rps_at_{clients}"] = bar(ratio, f">= {floor}")
    if "precision" in results:
        unchanged = results["precision"]["labels_unchanged_pct"]
        out["default_corpus_labels_unchanged_pct"] = bar(unchanged, ">= 99.5")
        accuracy = results["precision"]["held_out_accuracy"]
        moved = round(abs(accuracy[results["default_precision"]] - accuracy["fp32"]), 4)
        out["default_held_out_accuracy_vs_fp32"] = bar(moved, "<= 0.01")
    default = level(scenarios, "torchserve_batched", 32)
    return out | (_default_bars(default, results) if default else {})


def _default_bars(default: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """The default at 32 clients against the ceiling and each peer, and at 1 against LitServe."""
    scenarios, ceiling = results["scenarios"], results["ceiling"]
    ratio = _ratio(default["rps"], ceiling["texts_per_s"])
    out = {"default_vs_ceiling_at_32": bar(ratio, ">= 0.8")}
    out["default_vs_best_ceiling_at_32"] = bar(ratio, ">= 0.75")
    if default.get("mean_batch_size"):
        formed = ceiling_at(ceiling["by_batch_size"], default["mean_batch_size"])
        out["default_vs_ceiling_at_formed_batch_at_32"] = bar(
            _ratio(default["rps"], formed), ">= 0.8"
        )
    for peer in PEERS:
        if at_32 := level(scenarios, peer, 32):
            out[f"default_vs_{peer}_at_32"] = bar(_ratio(default["rps"], at_32["rps"]), "> 1")
    ours, peer_at_1 = level(scenarios, "torchserve_batched", 1), level(scenarios, "litserve", 1)
    if ours and peer_at_1:
        out["default_vs_litserve_at_1"] = bar(_ratio(ours["rps"], peer_at_1["rps"]), ">= 1.0")
    return out


def ceiling_at(by_batch_size: dict[str, dict[str, float]], batch: float) -> float:
    """In-process texts/s at ``batch`` texts per batch: linear between the measured batch
    sizes around it, the nearest measured one outside them."""
    points = sorted((int(size), run["texts_per_s"]) for size, run in by_batch_size.items())
    if batch <= points[0][0]:
        return points[0][1]
    for (low, low_rate), (high, high_rate) in zip(points, points[1:], strict=False):
        if batch <= high:
            return low_rate + (high_rate - low_rate) * (batch - low) / (high - low)
    return points[-1][1]


def plot(results: dict[str, Any], out: Path) -> None:
    """``serving.png``: requests/s, p50 and p99 against clients, one line per scenario."""
    plt = pyplot()
    panels = (("rps", "requests/s"), ("p50_ms", "p50 latency (ms)"), ("p99_ms", "p99 latency (ms)"))
    figure, axes_row = plt.subplots(1, 3, figsize=(15, 4.4))
    for axes, (metric, ylabel) in zip(axes_row, panels, strict=True):
        for name, scenario in results["scenarios"].items():
            levels = sorted(scenario["by_concurrency"], key=int)
            values = [scenario["by_concurrency"][level][metric] for level in levels]
            axes.plot([int(level) for level in levels], values, marker="o", label=name)
        if metric == "rps":
            best = results["ceiling"]["best_batch_size"]
            label = f"in-process ceiling {results['default_precision']} (batch {best})"
            axes.axhline(
                results["ceiling"]["texts_per_s"], linestyle="--", color="grey", label=label
            )
        axes.set_xscale("log", base=2)
        if metric != "rps":
            axes.set_yscale("log")  # one slow peer must not flatten the others' latencies
        axes.set_xlabel("concurrent clients")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
    axes_row[0].legend(fontsize=8)
    figure.suptitle(f"Served model against concurrency ({results['machine']['cpus']} CPU cores)")
    figure.tight_layout()
    figure.savefig(out / "serving.png", dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("bench", __doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--seconds", type=float, default=8, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--smoke", action="store_true", help="seconds: the ceiling and the default")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = parser.parse_args(argv)
    device = args.device if args.device != "auto" else "cuda" if probe.gpu_count() else "cpu"
    if args.smoke:
        args.seconds, args.warmup = 1.5, 0.5
    corpus = make_corpus()
    results: dict[str, Any] = {
        "command": "python -m lab bench --smoke" if args.smoke else "make bench",
        "started": now(),
        "machine": describe(),
        "corpus": corpus_stats(corpus),
        "seconds_per_level": args.seconds,
        "device": device,
    }
    gpus = probe.gpu_count() if device == "cuda" else 0
    plan = Plan(
        args.model_dir, args.seconds, args.warmup, args.smoke, device, chosen_precision(gpus)
    )
    results |= run(plan, corpus)
    results["ratios"] = ratios(results)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "results.json", results)
    plot(results, args.out)
    print(dumps(results["ratios"]))
    step(f"wrote {args.out / 'results.json'} and serving.png")
    return 0
