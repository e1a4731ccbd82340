"""The labelled reviews (``scripts/data/reviews.tsv``) and the benchmark corpus made from them.

The corpus is deterministic: review sentences stitched into texts whose word counts follow a
short-skewed (log-normal) distribution clipped to 5..200 words.
"""

from __future__ import annotations

import csv
import math
import random
import re
from pathlib import Path

from bert_serve_server.config import ROOT

DATA_FILE = ROOT / "scripts" / "data" / "reviews.tsv"
LABELS = ("negative", "positive")
Example = tuple[str, int]


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


def make_corpus(
    size: int = 2000, seed: int = 7, min_words: int = 5, max_words: int = 200
) -> list[str]:
    reviews = [row["text"] for row in read_rows(DATA_FILE)]
    sentences = [s for review in reviews for s in re.split(r"(?<=[.!?])\s+", review) if s.strip()]
    rng = random.Random(seed)
    corpus = []
    for _ in range(size):
        target = min(max_words, max(min_words, round(rng.lognormvariate(math.log(25), 0.8))))
        words: list[str] = []
        while len(words) < target:
            words += rng.choice(sentences).split()
        corpus.append(" ".join(words[:target]))
    return corpus


def corpus_stats(corpus: list[str]) -> dict[str, float]:
    counts = sorted(len(text.split()) for text in corpus)
    return {
        "texts": len(corpus),
        "words_p50": counts[len(counts) // 2],
        "words_p90": counts[int(len(counts) * 0.9)],
        "words_max": counts[-1],
        "words_min": counts[0],
    }
