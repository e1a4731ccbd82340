"""What the model metrics cost (``handler/model_metrics.py``): the default archive served twice
at once, with ``config/metrics.yaml`` and with a copy that leaves the model metrics out (the
handler then emits none and computes none), loaded in turn at ``CLIENTS`` closed-loop clients
in rounds ordered A B B A ..., so a slow spell of a shared machine falls on both alike. Both
run one plan: the first start's (measured), stated to the second (``stated_as``), since two
starts may choose different batch sizes (issue 54), which would be measured in place of the
metrics. The bar: throughput with the metrics within 2 % of without. Beside it, the CPU
seconds the frontend and the workers spent per answered request in each server's turns
(``cpu_ms_per_request``): what the metrics cost the machine, which the load generator's share
of a small machine does not blur."""

from __future__ import annotations

import json
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil
import yaml
from bert_serve_server.config import ROOT
from bert_serve_server.control import THREADS_ENV, Server

from handler.model_metrics import COUNTERS, GAUGES, HISTOGRAMS
from lab.corpus import make_corpus
from lab.load import ClosedLoop, json_job
from lab.machine import describe
from lab.measure import servers

CLIENTS = 32
BAR = 0.02
METRICS = ROOT / "config" / "metrics.yaml"
NAMES = ("with", "without")
ROLES = ("frontend", "workers")


def cpu_seconds(server: Server) -> dict[str, float]:
    """CPU seconds (user and system) so far of the server's frontend and of its workers."""
    pids: dict[str, list[int | None]] = {
        "frontend": [server.pid()],
        "workers": [worker.pid for worker in server.workers()],
    }
    seconds = dict.fromkeys(ROLES, 0.0)
    for role, ids in pids.items():
        for pid in ids:
            if pid is None:
                continue
            try:
                times = psutil.Process(pid).cpu_times()
            except (psutil.Error, ValueError):
                continue
            seconds[role] += times.user + times.system
    return seconds


def without_model_metrics(path: Path) -> Path:
    """config/metrics.yaml less the model metrics' declarations, written to ``path``."""
    document = yaml.safe_load(METRICS.read_text())
    ours = {*COUNTERS, *HISTOGRAMS, *GAUGES}
    for kind, metrics in document["model_metrics"].items():
        document["model_metrics"][kind] = [m for m in metrics if m["name"] not in ours]
    path.write_text(yaml.safe_dump(document))
    return path


def stated_as(in_force: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The config overrides and environment that state what a start chose (its ``in_force``
    sizing): every model's workers and batch size, the queue, the heap, the torch threads."""
    overrides = {"models": json.dumps(in_force["models"]), "vmargs": in_force["vmargs"]}
    if in_force.get("job_queue_size"):
        overrides["job_queue_size"] = str(in_force["job_queue_size"])
    return overrides, {THREADS_ENV: str(in_force["torch_threads"])}


def load(server: Server, corpus: list[str], seconds: float) -> ClosedLoop:
    job = lambda i: json_job(corpus[i % len(corpus)])  # noqa: E731
    return ClosedLoop(
        server.predict_url, server.headers(), job, CLIENTS, seconds, int(seconds * 5000)
    ).run()


def run(store: Path, rounds: int, seconds: float) -> dict[str, Any]:
    corpus = make_corpus()
    with tempfile.TemporaryDirectory(prefix="bert-serve-metrics-cost-") as work:
        configs = {
            "with": {"model_store": str(store), "metrics_config": str(METRICS)},
            "without": {
                "model_store": str(store),
                "metrics_config": str(without_model_metrics(Path(work) / "metrics.yaml")),
            },
        }
        answered = dict.fromkeys(NAMES, 0)
        cpu = {name: dict.fromkeys(ROLES, 0.0) for name in NAMES}
        spent = dict.fromkeys(NAMES, 0.0)
        per_round: list[dict[str, float]] = []
        with ExitStack() as stack:
            started = stack.enter_context(servers({"with": configs["with"]}))
            sizing = started["with"]["server"].sizing()["in_force"]
            overrides, env = stated_as(sizing)
            started |= stack.enter_context(
                servers({"without": configs["without"] | overrides}, {"without": env})
            )
            for name in NAMES:
                load(started[name]["server"], corpus, 3.0)  # warm-up
            for number in range(rounds):
                order = NAMES if number % 2 == 0 else NAMES[::-1]
                this_round = {}
                for name in order:
                    server = started[name]["server"]
                    before = cpu_seconds(server)
                    loop = load(server, corpus, seconds)
                    after = cpu_seconds(server)
                    ok = sum(outcome.status == "200" for outcome in loop.outcomes)
                    answered[name] += ok
                    spent[name] += loop.elapsed
                    for role in ROLES:
                        cpu[name][role] += after[role] - before[role]
                    this_round[name] = round(ok / loop.elapsed, 2)
                per_round.append(this_round)
            in_force = {name: started[name]["config"] for name in NAMES}
    rps = {name: round(answered[name] / spent[name], 2) for name in NAMES}
    cost = round(1 - rps["with"] / rps["without"], 4)
    ratios = sorted(turns["with"] / turns["without"] for turns in per_round)
    per_request = {
        name: {role: round(cpu[name][role] / max(answered[name], 1) * 1e3, 3) for role in ROLES}
        for name in NAMES
    }
    return {
        "command": "python scripts/model_metrics_cost.py --out FILE",
        "machine": describe(),
        "clients": CLIENTS,
        "rounds": rounds,
        "seconds_per_turn": seconds,
        "sizing": sizing,
        "in_force": in_force,
        "rps": rps,
        "per_round": per_round,
        "cost": cost,
        "median_round_cost": round(1 - ratios[len(ratios) // 2], 4),
        "cpu_ms_per_request": per_request,
        "bar": {"needed": f"cost <= {BAR}", "met": cost <= BAR},
    }
