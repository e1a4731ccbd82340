"""The benchmark corpus, made from the labelled reviews (``training.DATA_FILE``): deterministic,
review sentences stitched into texts whose word counts follow a short-skewed (log-normal)
distribution clipped to 5..200 words."""

from __future__ import annotations

import math
import random
import re

from training import DATA_FILE, read_rows


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
