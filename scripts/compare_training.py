"""Train every recipe of ``harness.training.SCHEMES`` back to back and compare them: training
seconds (wall and CPU), the ratio to the default's, and held-out accuracy on the same 96
reviews of ``scripts/data/reviews.tsv``. Nothing is saved but the table.

    python scripts/compare_training.py --out build/training-schemes.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.training import SCHEMES, Recipe, fine_tune

KEYS = ("train_examples", "train_seconds", "train_cpu_seconds", "held_out_accuracy")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the table as JSON")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, recipe in SCHEMES.items():
        report = fine_tune(recipe)[2]
        rows.append({"scheme": name, "default": recipe == Recipe()} | {k: report[k] for k in KEYS})
        print(json.dumps(rows[-1]), flush=True)
    default = next(row for row in rows if row["default"])
    for row in rows:
        row["seconds_vs_default"] = round(row["train_seconds"] / default["train_seconds"], 2)
        print(
            f"{row['scheme']:<50} {row['train_seconds']:>6} s ({row['seconds_vs_default']}x)"
            f"  held-out {row['held_out_accuracy']:.4f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
