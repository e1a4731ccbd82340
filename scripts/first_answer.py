"""Seconds from `make serve` on a fresh clone, with empty pip and uv caches, to the first
answer 200, and each step's share (``lab.first_answer``); `make stop` after.

    python scripts/first_answer.py --out build/first-answer.json [--ref BRANCH] [-- MAKE ARGS]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from lab.first_answer import measure


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the timings as JSON")
    parser.add_argument("--ref", help="the branch to clone (default: this checkout's)")
    parser.add_argument("make_args", nargs="*", help="after --: arguments for make serve")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    ref = (
        args.ref
        or subprocess.run(
            ["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    )
    report = measure(root, ref, args.make_args)
    print(json.dumps(report, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
