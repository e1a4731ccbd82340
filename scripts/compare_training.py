"""Train every recipe of ``lab.training.SCHEMES`` back to back, once per held-out split of
``lab.training.SPLITS``, and compare them: training seconds (wall and CPU), the ratio to
the default's, held-out accuracy on each split's 96 reviews of ``scripts/data/reviews.tsv``
and accuracy on the evaluation-only ``scripts/data/reviews-hard.tsv`` and
``scripts/data/reviews-typical.tsv``, each with its mean over the splits. Nothing is saved
but the table.

    python scripts/compare_training.py --out build/training-schemes.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from statistics import mean
from typing import Any

from lab.training import SCHEMES, SPLITS, Recipe, fine_tune

KEYS = (
    "train_seconds",
    "train_cpu_seconds",
    "held_out_accuracy",
    "hard_accuracy",
    "typical_accuracy",
)


def measure(name: str, recipe: Recipe) -> dict[str, Any]:
    """The recipe trained on each split: each split's figures and their means."""
    reports = [fine_tune(replace(recipe, seed=seed))[2] for seed in SPLITS]
    row: dict[str, Any] = {
        "scheme": name,
        "default": recipe == Recipe(),
        "train_examples": reports[0]["train_examples"],
    }
    for key in KEYS:
        row[key] = round(mean(report[key] for report in reports), 4 if "accuracy" in key else 1)
        row[f"{key}_by_split"] = {
            seed: report[key] for seed, report in zip(SPLITS, reports, strict=True)
        }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the table as JSON")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, recipe in SCHEMES.items():
        rows.append(measure(name, recipe))
        print(json.dumps(rows[-1]), flush=True)
    default = next(row for row in rows if row["default"])
    for row in rows:
        row["seconds_vs_default"] = round(row["train_seconds"] / default["train_seconds"], 2)
        print(
            f"{row['scheme']:<50} {row['train_seconds']:>6} s ({row['seconds_vs_default']}x)"
            f"  held-out {row['held_out_accuracy']:.4f}  hard {row['hard_accuracy']:.4f}"
            f"  typical {row['typical_accuracy']:.4f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"splits": SPLITS, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
