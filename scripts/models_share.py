"""Two models on one server against one alone (``lab.models_share``); exits 1 if their
summed answers per second fall under 0.8 of one model's alone.

    python scripts/models_share.py --out docs/bench/models.json [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.models_share import run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the report as JSON")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per load")
    args = parser.parse_args()
    report = run(args.seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    alone = report["alone"]["result"]["rps"]
    pair = {name: r["rps"] for name, r in report["two_models"]["results"].items()}
    print(f"alone {alone}/s; two models {pair}: sum {report['sum_over_alone']} of alone")
    return 0 if report["bar"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
