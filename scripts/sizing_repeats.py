"""How much a start's batch-size choice and queue repeat (``lab.sizing_repeats``): the start's
rate measurement of an archive taken N times, each in a fresh process, with the choice each
makes and the spread of the chosen rate.

    python scripts/sizing_repeats.py --out build/sizing-repeats.json [--runs 8] [--threads 1] [--probe]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bert_serve_server.config import ROOT

from lab.sizing_repeats import run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the report as JSON")
    parser.add_argument("--mar", type=Path, default=ROOT / "model_store" / "bert.mar")
    parser.add_argument("--runs", type=int, default=8, help="fresh measurements, in a row")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, as a worker's")
    parser.add_argument(
        "--probe",
        action="store_true",
        help="measure on CPU 0 beside a fixed product on CPU 1: the machine's speed (lab.sizing_repeats)",
    )
    args = parser.parse_args()
    report = run(args.mar, args.runs, args.threads, args.probe)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for measured in report["runs"]:
        median = measured["by_median"]
        print(
            f"batchSize {measured['batch_size']} at {measured['rate']} texts/s (by the median: "
            f"{median['batch_size']} at {median['rate']}), {measured['seconds']} s, "
            f"{measured['cpu_per_wall']} CPU s a second"
        )
    print("best round:", report["summary"])
    print("median round:", report["summary_by_median"])
    if "at_steady_speed" in report:
        print("over the probe's speed:", report["at_steady_speed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
