"""``python -m training model --out DIR``: fine-tune and save the default model (``make model``;
exits 1 without saving if it misses the accuracy floor or a sanity sentence).
``python -m training reference --out FILE``: its held-out reviews, one a line (``make package``
packs their profile for the drift alerts)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training import Recipe, held_out_texts


def main(argv: list[str] | None = None) -> int:
    defaults = Recipe()
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser("model", help="fine-tune and save the default model")
    build.add_argument("--out", type=Path, required=True, help="output Hugging Face folder")
    build.add_argument("--encoder", type=Path, help="pretrained BERT folder")
    build.add_argument("--epochs", type=int, default=defaults.epochs)
    build.add_argument("--lr", type=float, default=defaults.lr)
    build.add_argument("--seed", type=int, default=defaults.seed)
    build.add_argument("--frozen-layers", type=int, default=defaults.frozen_layers)
    reference = verbs.add_parser("reference", help="write the held-out reviews")
    reference.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.verb == "reference":
        text = "".join(f"{line}\n" for line in held_out_texts())
        args.out.write_text(text, encoding="utf-8")
        return 0
    from training.fine_tune import fine_tune, rejection, save

    recipe = Recipe(
        args.encoder,
        epochs=args.epochs,
        lr=args.lr,
        seed=args.seed,
        frozen_layers=args.frozen_layers,
    )
    model, tokenizer, report = fine_tune(recipe)
    print(json.dumps(report, indent=2))
    reason = rejection(report)
    if reason:
        print(reason, file=sys.stderr)
        return 1
    save(model, tokenizer, report, args.out)
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
