"""What the model metrics cost at 32 clients (``lab.model_metrics_cost``); exits 1 when the
server with them answers more than 2 % less than without.

    python scripts/model_metrics_cost.py --out build/model-metrics-cost.json [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bert_serve_server.config import ROOT

from lab.model_metrics_cost import run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the report as JSON")
    parser.add_argument("--store", type=Path, default=ROOT / "model_store", help="holds bert.mar")
    parser.add_argument("--rounds", type=int, default=4, help="turns of each server, A B B A ...")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per turn")
    args = parser.parse_args()
    report = run(args.store, args.rounds, args.seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"answers/s {report['rps']}: the metrics cost {report['cost']:.2%}")
    return 0 if report["bar"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
