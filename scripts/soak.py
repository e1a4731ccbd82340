"""Soak: steady mixed traffic against a real TorchServe, watching memory, rps and the logs.

Starts its own server on free 127.0.0.1 ports, sends ``--concurrency`` clients' traffic for
``--seconds`` (every 10th request malformed, single texts and lists), samples the frontend's
and every worker's RSS, requests/s and the log folder's size, and writes ``soak.json`` and
``soak.png`` into --out (``lab.soak`` says what passes).

    python scripts/soak.py --out docs/soak                     # 10 minutes (make soak)
    python scripts/soak.py --seconds 20 --out /tmp/soak        # a check that the tool works

Prints a summary and a last line ``soak: passed`` or ``soak: FAILED``; exits 1 if it failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab import soak


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("docs/soak"))
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    report = soak.run(soak.Plan(args.seconds, args.concurrency))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    soak.plot(report, args.out / "soak.png")
    print(soak.summary_line(report))
    print(f"report: {args.out / 'soak.json'}, plot: {args.out / 'soak.png'}")
    print(f"soak: {'passed' if report['passed'] else 'FAILED'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
