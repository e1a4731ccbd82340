"""Write the default model's reference texts: its held-out reviews, one a line, the share of
``scripts/data/reviews.tsv`` that ``scripts/build_model.py`` never trains on (``lab.training``).
``make package`` packs their profile into the default model's archive (``--reference``).

    python scripts/reference_texts.py --out build/reference-reviews.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.training import Recipe, examples


def held_out_reviews() -> list[str]:
    return [text for text, _ in examples(Recipe())[1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(f"{text}\n" for text in held_out_reviews()), encoding="utf-8")


if __name__ == "__main__":
    main()
