"""Chaos: faults and overload against a real TorchServe, and a JSON report of what happened.

The experiments (``lab.chaos``, one module each), each on its own server (in the --quick form,
those on the default config share one) with a pass/fail verdict computed from its numbers: a poisoning soak (10 % malformed traffic), a
worker SIGKILL under load, a burst over a small queue, a body over the frontend's limit, a
restart in the same state folder, and the kill runs (--kills worker kills per load level,
counting the requests nobody answers) with the configured maxBatchDelay and with 20 ms. Every
loop is bounded in count and time.

    python scripts/chaos.py --out docs/chaos              # the full run (make chaos)
    python scripts/chaos.py --quick --out /tmp/chaos      # every duration a few seconds, 2 kills (1 at 20 ms)
    python scripts/chaos.py --only kill_runs kill_runs_long_delay --kills 50 --out docs/chaos
    python scripts/chaos.py --only spike --forms stamped --no-peer --set job_queue_size=160 \
        --out build/spike-queue160     # the spike under another config (or model_store=DIR)

Writes ``chaos.json`` ({part: result}) and, with the spike part, ``spike.png`` into --out (with --only, the other parts already in it
are kept), prints a summary table and a last line ``chaos: N passed, M failed``; exits 1 if
any part failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from lab.chaos import EXPERIMENTS, durations, run_part, spike, summary_table
from lab.chaos.common import SPIKE_FORMS, SharedServer
from lab.measure import env_assignments


def previous_report(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    args = parser.parse_args()
    shared = SharedServer() if args.quick else None
    plan = dataclasses.replace(
        durations(args.seconds, args.quick, args.kills),
        spike_set=env_assignments(args.set),
        spike_forms=tuple(args.forms),
        spike_peer=not args.no_peer,
        shared=shared,
    )
    names = args.only or list(EXPERIMENTS)
    started = time.monotonic()
    try:
        report = {name: run_part(name, EXPERIMENTS[name], plan) for name in names}
    finally:
        if shared is not None:
            shared.close()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "chaos.json"
    merged = (previous_report(path) if args.only else {}) | report
    path.write_text(json.dumps(merged, indent=2) + "\n")
    if "levels" in report.get("spike", {}):
        spike.plot(report["spike"], args.out)
    passed = sum(result["passed"] for result in report.values())
    print(summary_table(report))
    print(f"report: {path} ({time.monotonic() - started:.0f} s)")
    print(f"chaos: {passed} passed, {len(report) - passed} failed")
    return 0 if passed == len(report) else 1


if __name__ == "__main__":
    sys.exit(main())
