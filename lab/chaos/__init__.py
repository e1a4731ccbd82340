"""``make chaos``: faults and overload against a real TorchServe, one module each, each with a
verdict from its numbers (docs/chaos/README.md says what each injects and requires). Each part
has its own server, always stopped; in ``--quick`` the parts on the default config share one
(``common.SharedServer``). Every loop is bounded in count and time. Writes ``chaos.json``
({part: result}; with ``--only`` the other parts in it are kept) and, with the spike,
``spike.png``; exits 1 if a part failed.

    python -m lab chaos --quick --out /tmp/chaos     # every duration a few seconds
    python -m lab chaos --only kill_runs --kills 50 --out docs/chaos
    python -m lab chaos --only spike --forms stamped --no-peer --set job_queue_size=160 --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.chaos import (
    kill_runs,
    overload,
    oversized,
    poisoning_soak,
    restart,
    spike,
    worker_crash,
)
from lab.chaos.common import SPIKE_FORMS, Durations, SharedServer, durations
from lab.report import write_json

Experiment = Callable[[Durations], dict[str, Any]]
EXPERIMENTS: dict[str, Experiment] = {
    "poisoning_soak": poisoning_soak.run,
    "worker_crash": worker_crash.run,
    "overload": overload.run,
    "oversized": oversized.run,
    "restart": restart.run,
    "kill_runs": kill_runs.run,
    "kill_runs_long_delay": kill_runs.run_long_delay,
    "spike": spike.run,
}


def run_part(name: str, part: Experiment, d: Durations) -> dict[str, Any]:
    """One part; a part that raises is a failed part, and the others still run."""
    print(f"chaos: {name} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        result = part(d)
    except Exception as error:  # reported as this part's failure
        result = {"passed": False, "error": f"{type(error).__name__}: {error}", "summary": "error"}
    result["part_seconds"] = round(time.monotonic() - started, 1)
    print(f"chaos: {name} {'passed' if result['passed'] else 'FAILED'}", file=sys.stderr)
    return result


def summary_table(report: dict[str, dict[str, Any]]) -> str:
    rows = [f"{'part':<22} {'verdict':<7} {'s':>6}  what happened"]
    for name, result in report.items():
        verdict = "pass" if result["passed"] else "FAIL"
        detail = result.get("error") or result.get("summary", "")
        rows.append(f"{name:<22} {verdict:<7} {result['part_seconds']:>6}  {detail}")
    return "\n".join(rows)


def assignments(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` arguments (config.properties keys) as a mapping."""
    pairs = [item.partition("=") for item in items]
    if bad := [
        item for item, (key, sign, _) in zip(items, pairs, strict=True) if not key or not sign
    ]:
        raise SystemExit(f"settings must be KEY=VALUE, got {bad}")
    return {key: value for key, _, value in pairs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("docs/chaos"))
    parser.add_argument("--seconds", type=float, default=30.0, help="soak duration")
    parser.add_argument("--quick", action="store_true", help="every duration a few seconds")
    parser.add_argument("--only", nargs="+", choices=EXPERIMENTS, help="run these parts only")
    parser.add_argument(
        "--kills", type=int, help="worker kills per load level (50; quick: 2, 1 at 20 ms)"
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="spike: config overrides"
    )
    parser.add_argument("--forms", nargs="+", choices=SPIKE_FORMS, default=list(SPIKE_FORMS))
    parser.add_argument("--no-peer", action="store_true", help="spike: without LitServe")
    args = parser.parse_args(argv)
    shared = SharedServer() if args.quick else None
    plan = dataclasses.replace(
        durations(args.seconds, args.quick, args.kills),
        spike_set=assignments(args.set),
        spike_forms=tuple(args.forms),
        spike_peer=not args.no_peer,
        shared=shared,
    )
    started = time.monotonic()
    try:
        report = {
            name: run_part(name, EXPERIMENTS[name], plan) for name in args.only or EXPERIMENTS
        }
    finally:
        if shared is not None:
            shared.close()
    path = args.out / "chaos.json"
    kept = json.loads(path.read_text()) if args.only and path.is_file() else {}
    write_json(path, kept | report)
    if "levels" in report.get("spike", {}):
        spike.plot(report["spike"], args.out)
    passed = sum(result["passed"] for result in report.values())
    print(summary_table(report))
    print(f"report: {path} ({time.monotonic() - started:.0f} s)")
    print(f"chaos: {passed} passed, {len(report) - passed} failed")
    return 0 if passed == len(report) else 1
