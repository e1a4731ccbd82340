"""``make soak``: steady mixed traffic on a server of its own for a long time; writes
``soak.json`` and ``soak.png`` into ``--out``, exits 1 if the run failed
(``python -m lab soak --seconds 20 --out /tmp/soak`` checks that the tool works).

Every 10th request is malformed (each kind in turn), the others alternate a text and a list of
2 to 8. Every ``interval_s`` a sample takes the frontend's and each worker's RSS, requests/s and
the log folder's size. After the warm-up (a tenth of the run, 5 to 60 s) the first sample is
each process's baseline; the run passes if every later one stays within ``RSS_TOLERANCE`` of it,
no worker was replaced and every request got the status its kind expects.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from bert_serve_server.control import Server, running

from lab.chaos import MALFORMED
from lab.corpus import make_corpus
from lab.load import ClosedLoop, Job, Outcome, json_job, statuses
from lab.report import pyplot, tool_parser, write_json

RSS_TOLERANCE = 0.10
REQUEST_TIMEOUT_S = 70.0
MIX = "every 10th request malformed (7 kinds in turn); others alternate one text and a list of 2-8"


@dataclass(frozen=True)
class Plan:
    seconds: float
    concurrency: int = 8

    @property
    def warmup_s(self) -> float:
        return min(60.0, max(5.0, self.seconds / 10))

    @property
    def interval_s(self) -> float:
        return max(1.0, self.seconds / 120)


def job_for(corpus: list[str], n: int) -> Job:
    """The n-th request: malformed every 10th, else a single text or a list, in turn."""
    if n % 10 == 9:
        return MALFORMED[(n // 10) % len(MALFORMED)]
    if n % 2 == 0:
        return json_job(corpus[n % len(corpus)])
    size = 2 + n % 7
    start = (n * 8) % (len(corpus) - size)
    body = json.dumps({"texts": corpus[start : start + size]}).encode()
    return Job(body, "application/json", kind="list", expected=str(size))


def answered_as_expected(outcome: Outcome) -> bool:
    """The status the job's kind expects; a list's 200 must hold one result per text."""
    if outcome.status != str(outcome.job.status):
        return False
    try:
        return outcome.job.kind != "list" or (
            len(json.loads(outcome.body)["results"]) == int(outcome.job.expected)
        )
    except (ValueError, KeyError, TypeError):
        return False


@dataclass(frozen=True)
class Sample:
    seconds: float
    answered: int
    rps: float
    frontend_mb: float | None
    worker_mb: dict[str, float | None]
    worker_pids: dict[str, int]
    log_bytes: int


def log_files(folder: Path) -> dict[str, int]:
    """Bytes per log file, largest first: which log grows."""
    sizes = {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    return dict(sorted(sizes.items(), key=lambda item: -item[1]))


async def sample(server: Server, load: ClosedLoop, plan: Plan, samples: list[Sample]) -> None:
    """A sample every ``interval_s`` beside the load until the run's time is up or the load
    stopped."""
    started = last_time = time.monotonic()
    last_done = 0
    while not load.stopped and time.monotonic() - started < plan.seconds:
        await asyncio.sleep(plan.interval_s)
        now, done = time.monotonic(), len(load.outcomes)
        memory = await asyncio.to_thread(server.memory)
        logs = await asyncio.to_thread(log_files, server.state_dir / "logs")
        samples.append(
            Sample(
                seconds=round(now - started, 1),
                answered=done,
                rps=round((done - last_done) / max(now - last_time, 1e-9), 1),
                frontend_mb=memory.frontend_rss_mb,
                worker_mb={worker: entry.rss_mb for worker, entry in memory.workers.items()},
                worker_pids={worker: entry.pid for worker, entry in memory.workers.items()},
                log_bytes=sum(logs.values()),
            )
        )
        last_time, last_done = now, done


def series(samples: list[Sample]) -> dict[str, list[float | None]]:
    """RSS in MB per process ("frontend", "worker <id>"), one value per sample."""
    workers = sorted({worker for sample in samples for worker in sample.worker_mb})
    out: dict[str, list[float | None]] = {"frontend": [s.frontend_mb for s in samples]}
    for worker in workers:
        out[f"worker {worker}"] = [s.worker_mb.get(worker) for s in samples]
    return out


def drift(values: list[float | None]) -> dict[str, float | None]:
    """Baseline (the first value), range and the largest relative drift from the baseline.

    ``second_half_growth_pct`` (last value against the one halfway) tells a leak, which keeps
    growing, from a warm-up that outlasted the warm-up window and levelled off.
    """
    present = [value for value in values if value is not None]
    if not present or len(present) != len(values):
        return {"baseline_mb": None, "max_drift_pct": None}
    baseline, halfway = present[0], present[len(present) // 2]
    worst = max(abs(value - baseline) for value in present) / baseline
    return {
        "baseline_mb": baseline,
        "min_mb": min(present),
        "max_mb": max(present),
        "last_mb": present[-1],
        "max_drift_pct": round(100 * worst, 1),
        "second_half_growth_pct": round(100 * (present[-1] - halfway) / halfway, 1),
    }


def log_growth(first: Sample, last: Sample) -> dict[str, float]:
    growth = last.log_bytes - first.log_bytes
    minutes = max(last.seconds - first.seconds, 1e-9) / 60
    return {
        "bytes_at_warmup": first.log_bytes,
        "bytes_at_end": last.log_bytes,
        "growth_bytes": growth,
        "bytes_per_minute": round(growth / minutes),
        "bytes_per_1000_requests": round(1000 * growth / max(last.answered - first.answered, 1)),
    }


def summarize(plan: Plan, outcomes: list[Outcome], samples: list[Sample]) -> dict[str, Any]:
    after = [sample for sample in samples if sample.seconds >= plan.warmup_s]
    if not after:
        raise RuntimeError(f"no sample after the {plan.warmup_s:.0f} s warm-up")
    wrong = [o for o in outcomes if not answered_as_expected(o)]
    kinds = sorted({outcome.job.kind for outcome in outcomes})
    report: dict[str, Any] = {
        "seconds": plan.seconds,
        "concurrency": plan.concurrency,
        "warmup_s": plan.warmup_s,
        "interval_s": plan.interval_s,
        "mix": MIX,
        "requests": len(outcomes),
        "by_kind": {kind: statuses([o for o in outcomes if o.job.kind == kind]) for kind in kinds},
        "unexpected": len(wrong),
        "unexpected_examples": [f"{o.job.kind}: {o.status}" for o in wrong[:10]],
        "rps_after_warmup": round(sum(s.rps for s in after) / len(after), 1),
        "rss_tolerance_pct": 100 * RSS_TOLERANCE,
        "rss": {name: drift(values) for name, values in series(after).items()},
        "workers_replaced": len({json.dumps(s.worker_pids, sort_keys=True) for s in samples}) > 1,
        "log_folder": log_growth(after[0], after[-1]),
    }
    drifts = [entry["max_drift_pct"] for entry in report["rss"].values()]
    bounded = all(d is not None and d <= 100 * RSS_TOLERANCE for d in drifts)
    report["passed"] = bounded and not report["workers_replaced"] and not wrong
    return report | {"samples": [asdict(sample) for sample in samples]}


def run(plan: Plan) -> dict[str, Any]:
    """Start a server, soak it, and return the report (with every sample)."""
    corpus = make_corpus()
    samples: list[Sample] = []
    with running(prefix="bert-serve-soak-") as server:
        load = ClosedLoop(
            server.predict_url,
            server.headers(),
            lambda n: job_for(corpus, n),
            plan.concurrency,
            plan.seconds,
            request_timeout_s=REQUEST_TIMEOUT_S,
        )
        load.run(sample(server, load, plan, samples))
        files = log_files(server.state_dir / "logs")
    report = summarize(plan, load.outcomes, samples)
    report["log_folder"]["files_at_end"] = files
    return report | {"machine_cpus": psutil.cpu_count()}


def plot(report: dict[str, Any], path: Path) -> None:
    """RSS per process (with the tolerance band around each baseline), requests/s and the log
    folder's size over time."""
    plt = pyplot()
    samples = [Sample(**sample) for sample in report["samples"]]
    times = [sample.seconds for sample in samples]
    figure, (rss, rps, logs) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for name, values in series(samples).items():
        rss.plot(times, values, label=name)
        if baseline := report["rss"].get(name, {}).get("baseline_mb"):
            band = (baseline * (1 - RSS_TOLERANCE), baseline * (1 + RSS_TOLERANCE))
            rss.axhspan(*band, alpha=0.08, color=rss.lines[-1].get_color())
    rss.set_ylabel("RSS (MB)")
    rss.set_title(f"Soak: {report['seconds']:.0f} s at {report['concurrency']} clients")
    rss.legend(fontsize=8)
    rps.plot(times, [sample.rps for sample in samples], color="tab:green")
    rps.set_ylabel("requests/s")
    logs.plot(times, [sample.log_bytes / 2**20 for sample in samples], color="tab:grey")
    logs.set_ylabel("log folder (MB)")
    logs.set_xlabel("seconds")
    for axes in (rss, rps, logs):
        axes.axvline(report["warmup_s"], linestyle="--", color="grey", linewidth=0.8)
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("soak", __doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/soak"))
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    report = run(Plan(args.seconds, args.concurrency))
    write_json(args.out / "soak.json", report)
    plot(report, args.out / "soak.png")
    drifts = ", ".join(
        f"{name} {entry['max_drift_pct']} %" for name, entry in report["rss"].items()
    )
    logs = report["log_folder"]
    print(
        f"{report['requests']} requests ({report['rps_after_warmup']} rps after warm-up), "
        f"{report['unexpected']} unexpected answers; largest RSS drift from warm-up: {drifts}; "
        f"log folder +{logs['growth_bytes']} bytes ({logs['bytes_per_minute']} bytes/min)"
    )
    print(f"report: {args.out / 'soak.json'}, plot: {args.out / 'soak.png'}")
    print(f"soak: {'passed' if report['passed'] else 'FAILED'}")
    return 0 if report["passed"] else 1
