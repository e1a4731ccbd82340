"""Chaos: faults and overload against a real TorchServe, and a JSON report of what happened.

The experiments (``bert_serve.harness.faults``), each on its own server with a pass/fail
verdict computed from its numbers: a poisoning soak (10 % malformed traffic), a worker
SIGKILL under load, a burst over a small queue, a body over the frontend's limit, and a
restart in the same state folder. Every loop is bounded in count and time.

    python scripts/chaos.py --out docs/chaos              # the full run (make chaos)
    python scripts/chaos.py --quick --out /tmp/chaos      # every duration a few seconds

Writes ``chaos.json`` ({part: result}) into --out, prints a summary table and a last line
``chaos: N passed, M failed``; exits 1 if any part failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bert_serve.harness import faults

EXPERIMENTS = {
    "poisoning_soak": faults.poisoning_soak,
    "worker_crash": faults.worker_crash,
    "overload": faults.overload,
    "oversized": faults.oversized,
    "restart": faults.restart,
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("docs/chaos"))
    parser.add_argument("--seconds", type=float, default=30.0, help="soak duration")
    parser.add_argument("--quick", action="store_true", help="every duration a few seconds")
    args = parser.parse_args()
    durations = faults.durations(args.seconds, args.quick)
    started = time.monotonic()
    report = {name: faults.run_part(name, part, durations) for name, part in EXPERIMENTS.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    passed = sum(result["passed"] for result in report.values())
    print(faults.summary_table(report))
    print(f"report: {args.out / 'chaos.json'} ({time.monotonic() - started:.0f} s)")
    print(f"chaos: {passed} passed, {len(report) - passed} failed")
    return 0 if passed == len(report) else 1


if __name__ == "__main__":
    sys.exit(main())
