"""``make check-defaults``: the shipped defaults on hardware this machine is not. Writes
``defaults.json`` into ``--out``, prints each model's sizing and bars, exits 1 if a bar is not
met (``python -m lab check-defaults --models fast --seconds 5 --out /tmp/defaults``).

The default model and its stand-ins (``lab.standins``: ``fast``, a machine about 10x faster;
``slow``, bert-base or a slower machine), each on a server started as ``make serve`` starts it,
then closed loops in turn: ``capacity`` (32 patient clients: the patient throughput),
``patient`` (256 clients waiting up to 60 s, sending again at once: any non-200 is a refusal),
``stated`` and ``unstated`` (about 4x as many clients as the server answers in 0.5 s, 64 to
256, each with a 0.5 s deadline, sending again 50 ms after a failure; ``stated`` ones send
``X-Request-Start`` and ``X-Request-Timeout`` as ``bert_serve.Client`` does). A stamped 200
whose ``x-wait-time`` exceeds the client's wait (or lacks it) was ``forwarded_late``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_serve_server.archive import DEFAULT_MODEL_DIR, package_variant
from bert_serve_server.config import ROOT
from bert_serve_server.control import Server, running

from lab.batchlog import batch_times, observed
from lab.corpus import make_corpus
from lab.load import ClosedLoop, cores_by_role, in_turn, percentile, server_processes, statuses
from lab.report import describe, now, tool_parser, write_json
from lab.standins import reshaped

MODELS = ("default", "fast", "slow")
CAPACITY_CLIENTS = 32
PATIENT_CLIENTS = 256
PATIENT_TIMEOUT_S = 60.0
DEADLINE_S = 0.5
OVERLOAD = 4
STATED_CLIENTS = (64, 256)
PAUSE_AFTER_FAILURE_S = 0.05
BARS = {"stated_share": 0.6, "stated_share_default": 0.7}


@dataclass(frozen=True)
class Level:
    clients: int
    timeout_s: float
    stamped: bool = False
    pause_s: float = 0.0


def run_level(server: Server, corpus: list[str], level: Level, seconds: float) -> dict[str, Any]:
    """The level's answers; the cores the frontend, the workers and this load generator used
    meanwhile (they share the machine: refusals cost CPU where the model would run); and the
    texts the workers worked on against those answered in time (the rest was work wasted)."""
    load = ClosedLoop(
        server.predict_url,
        server.headers(),
        in_turn(corpus),
        level.clients,
        seconds,
        max_requests=int(seconds * 5000),
        request_timeout_s=level.timeout_s,
        pause_after_failure_s=level.pause_s,
        stamped=level.stamped,
    )
    cores, (logged,) = observed(load, server_processes(server), [server.model_log])
    batches = batch_times(logged)
    ok, limit_ms = [o for o in load.outcomes if o.status == "200"], level.timeout_s * 1000
    in_time = [o for o in ok if o.ms <= limit_ms]
    late = [o for o in ok if level.stamped and (o.waited_ms is None or o.waited_ms > limit_ms)]
    return {
        "clients": level.clients,
        "timeout_s": level.timeout_s,
        "stamped": level.stamped,
        "statuses": statuses(load.outcomes),
        "refusals": len(load.outcomes) - len(ok),
        "goodput_per_s": round(len(in_time) / load.elapsed, 1),
        "p50_ms": round(percentile([o.ms for o in ok], 50), 1),
        "p99_ms": round(percentile([o.ms for o in ok], 99), 1),
        "forwarded_late": len(late),
        "silently_lost": load.silently_lost,
        "texts_worked_on": batches["texts_forwarded"],
        "expired_by_workers": batches["expired"],
        "cores": cores_by_role(cores),
    }


def settle(server: Server, corpus: list[str], seconds: float) -> None:
    """Let what a level left queued drain: wait until a lone request is answered at once."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        probe = run_level(server, corpus, Level(1, PATIENT_TIMEOUT_S), 0.5)
        if probe["refusals"] == 0 and probe["p50_ms"] < 1000:
            return
        time.sleep(1)


def check_model(server: Server, corpus: list[str], seconds: float) -> dict[str, Any]:
    """The levels on one server, in order, and the shares of the patient throughput."""
    capacity = run_level(server, corpus, Level(CAPACITY_CLIENTS, PATIENT_TIMEOUT_S), seconds)
    answered_in_deadline = capacity["goodput_per_s"] * DEADLINE_S
    clients = int(min(max(OVERLOAD * answered_in_deadline, STATED_CLIENTS[0]), STATED_CLIENTS[1]))
    levels = {"capacity": capacity}
    plan = {
        "patient": Level(PATIENT_CLIENTS, PATIENT_TIMEOUT_S),
        "stated": Level(clients, DEADLINE_S, stamped=True, pause_s=PAUSE_AFTER_FAILURE_S),
        "unstated": Level(clients, DEADLINE_S, pause_s=PAUSE_AFTER_FAILURE_S),
    }
    for name, level in plan.items():
        settle(server, corpus, 60)
        levels[name] = run_level(server, corpus, level, seconds)
    patient_rate = capacity["goodput_per_s"] or 1.0
    for name in ("stated", "unstated"):
        levels[name]["share_of_patient"] = round(levels[name]["goodput_per_s"] / patient_rate, 2)
    return {"sizing": server.sizing()["in_force"], "levels": levels}


def bars(model: str, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each bar of issue 38 for one model: its value, what it needs and whether it is met."""
    levels = result["levels"]
    share_needed = BARS["stated_share_default" if model == "default" else "stated_share"]
    stated, unstated = levels["stated"], levels["unstated"]
    # The bar holds "under a spike of impatient clients": where the clients that state
    # nothing all got their answers, the load was no spike (the fast model: 256 clients are
    # the level's cap, a fraction of what it answers in 0.5 s) and the bar does not apply.
    spike = unstated["refusals"] > 0
    refusals, share, late = (
        levels["patient"]["refusals"],
        stated["share_of_patient"],
        stated["forwarded_late"],
    )
    versus = f"{stated['goodput_per_s']} vs {unstated['goodput_per_s']}"
    checks = {
        "patient_refusals": (refusals, "== 0", refusals == 0),
        "stated_share_of_patient": (share, f">= {share_needed}", share >= share_needed),
        "stated_vs_unstated_goodput": (
            versus + ("" if spike else " (no spike: every unstated request answered)"),
            ">= under a spike",
            stated["goodput_per_s"] >= unstated["goodput_per_s"] or not spike,
        ),
        "forwarded_late": (late, "== 0", late == 0),
    }
    return {name: {"value": v, "needed": n, "met": m} for name, (v, n, m) in checks.items()}


@contextmanager
def served(model: str, workdir: Path) -> Iterator[Server]:
    """A server of ``model`` (a name of ``MODELS``) with the shipped config, always stopped."""
    model_dir = DEFAULT_MODEL_DIR
    if model != "default":
        model_dir = reshaped(DEFAULT_MODEL_DIR, workdir / f"{model}-model", model)
    store = workdir / f"{model}-store"
    store.mkdir()
    package_variant(store, model_dir=model_dir)
    with running({"model_store": str(store)}) as server:
        yield server


def run(models: tuple[str, ...], seconds: float) -> dict[str, Any]:
    corpus = make_corpus()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bert-serve-defaults-") as workdir:
        for model in models:
            with served(model, Path(workdir)) as server:
                result = check_model(server, corpus, seconds)
            result["bars"] = bars(model, result)
            results[model] = result
    return results


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("check-defaults", __doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--seconds", type=float, default=15, help="seconds per level")
    args = parser.parse_args(argv)
    report = {"command": "make check-defaults", "started": now(), "machine": describe()}
    results = run(tuple(args.models), args.seconds)
    report |= {"seconds_per_level": args.seconds, "models": results}
    write_json(args.out / "defaults.json", report)
    failed = 0
    for model, result in results.items():
        in_force = result["sizing"]
        (entry,) = [e for v in in_force["models"].values() for e in v.values()]
        print(
            f"{model}: {entry['minWorkers']} workers x {in_force['torch_threads']} thread(s), "
            f"batchSize {entry['batchSize']}, job_queue_size {in_force['job_queue_size']}; "
            f"capacity {result['levels']['capacity']['goodput_per_s']}/s"
        )
        for name, bar in result["bars"].items():
            failed += not bar["met"]
            verdict = "met" if bar["met"] else "NOT MET"
            print(f"  {name}: {bar['value']} (needed {bar['needed']}): {verdict}")
    print(f"wrote {args.out / 'defaults.json'}")
    return 1 if failed else 0
