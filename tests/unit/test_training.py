"""The default model's training (``training``, ``make model``), on the tiny BERT."""

from __future__ import annotations

import random
import re
from difflib import SequenceMatcher
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from training import DATA_FILE, EXTRA_FILE, HARD_FILE, TYPICAL_FILE, Recipe, read_reviews, split
from training.fine_tune import batches, collate, features, pretrained, top_only, train

TEXTS = ["Fine.", "A long and winding review of a film that was not good at all.", "Loved it!"]


@pytest.mark.parametrize("frozen", [0, 1, 2])
def test_precomputed_bottom_gives_the_whole_models_logits(
    tiny_model_dir: Path, frozen: int
) -> None:
    """Training from the frozen bottom's saved hidden states runs the same model as a forward
    from the text: the same logits within 1e-5 (an off-by-one layer would differ by 1e-2)."""
    model, tokenizer = pretrained(tiny_model_dir)
    model.eval()
    with torch.no_grad():
        expected = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits
        batch = collate(features(model, tokenizer, TEXTS, 128, frozen), tokenizer.pad_token_id)
        with top_only(model, frozen):
            got = model(**batch).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert len(model.base_model.encoder.layer) == 2  # restored


def test_training_changes_only_the_unfrozen_weights(tiny_model_dir: Path) -> None:
    model, tokenizer = pretrained(tiny_model_dir)
    before = {name: weight.detach().clone() for name, weight in model.named_parameters()}
    examples = [(text, index % 2) for index, text in enumerate(TEXTS * 4)]
    train(model, tokenizer, examples, Recipe(epochs=1, batch_size=4, lr=1e-2, frozen_layers=1))
    changed = {
        name for name, weight in model.named_parameters() if not torch.equal(weight, before[name])
    }
    assert not any(
        name.startswith(("bert.embeddings", "bert.encoder.layer.0.")) for name in changed
    )
    assert any(name.startswith("bert.encoder.layer.1.") for name in changed)
    assert {"classifier.weight", "bert.pooler.dense.weight"} <= changed


def test_collate_pads_right_and_masks() -> None:
    batch = collate([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    states = collate([torch.ones(2, 4), torch.ones(1, 4)], pad_id=0)
    assert states["inputs_embeds"].shape == (2, 2, 4)
    assert states["attention_mask"].tolist() == [[1, 1], [1, 0]]


@pytest.mark.parametrize("bucketed", [False, True])
def test_batches_hold_every_example_once(bucketed: bool) -> None:
    lengths = [random.Random(1).randint(1, 100) for _ in range(50)]
    out = batches(lengths, 8, random.Random(0), bucketed)
    assert sorted(i for batch in out for i in batch) == list(range(50))
    assert [len(batch) for batch in out].count(8) == 6
    assert out == batches(lengths, 8, random.Random(0), bucketed)  # the seed decides


def test_bucketed_batches_hold_similar_lengths() -> None:
    """Sorted by length, then shuffled as whole batches: no batch spans another's lengths."""
    rng = random.Random(3)
    lengths = [rng.randint(1, 1000) for _ in range(64)]
    spans = sorted(
        (min(lengths[i] for i in b), max(lengths[i] for i in b))
        for b in batches(lengths, 8, random.Random(0), True)
    )
    assert all(high <= low_next for (_, high), (low_next, _) in pairwise(spans))
    assert batches(lengths, 8, random.Random(0), True) != batches(
        lengths, 8, random.Random(1), True
    )


def normalized(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def test_held_out_reviews_are_never_trained_on() -> None:
    """The held-out share of reviews.tsv is not in the training split, nor (even with other
    case or punctuation) in the training-only reviews of the default recipe."""
    recipe = Recipe()
    assert EXTRA_FILE in recipe.extra and recipe.data == DATA_FILE
    train_set, held_out = split(read_reviews(recipe.data), recipe.held_out, recipe.seed)
    trained = {normalized(text) for path in recipe.extra for text, _ in read_reviews(path)}
    trained |= {normalized(text) for text, _ in train_set}
    assert len(held_out) == 96
    assert not trained & {normalized(text) for text, _ in held_out}


def near(text: str, other: str) -> bool:
    """Within a fifth of its characters of ``other`` (difflib's ratio >= 0.8), after case and
    punctuation are dropped."""
    return bool(near_copies([text], [other]))


def near_copies(texts: list[str], others: list[str]) -> list[tuple[str, str]]:
    """Every (text, other) pair that is near: the cheap bounds first (the lengths alone bound
    the ratio), each other's difflib index built once."""
    found = []
    matcher = SequenceMatcher(None)
    keyed = [(text, normalized(text)) for text in texts]
    for other in others:
        matcher.set_seq2(normalized(other))
        for text, key in keyed:
            shorter, longer = sorted((len(key), len(matcher.b)))
            if 2 * shorter < 0.8 * (shorter + longer):
                continue
            matcher.set_seq1(key)
            if matcher.quick_ratio() >= 0.8 and matcher.ratio() >= 0.8:
                found.append((text, other))
    return found


def texts(path: Path) -> list[str]:
    return [text for text, _ in read_reviews(path)]


def test_near_copies_are_found() -> None:
    """Reworded a little: "The plot holes are big enough" against "... were big enough" is 0.97."""
    assert near("The plot holes are big enough.", "The plot holes were big enough.")
    assert not near("The plot holes are big enough.", "The soundtrack is gorgeous.")
    assert near_copies(["Worth every penny!"], ["A bore.", "worth every penny"])


def test_no_training_review_is_a_near_copy_of_a_review_that_can_be_held_out() -> None:
    """Not even reworded a little, for any split (any seed holds out another share):
    no training-only review is a near copy of any review of reviews.tsv."""
    copies = near_copies(texts(EXTRA_FILE), texts(DATA_FILE))
    assert not copies, copies[:5]


@pytest.mark.parametrize(("path", "least"), [(HARD_FILE, 500), (TYPICAL_FILE, 200)])
def test_evaluation_reviews_are_balanced_and_never_trained_on(path: Path, least: int) -> None:
    """The hard and the typical reviews are balanced, and none is a near copy of a review
    trained on, nor one of the other set."""
    reviews = read_reviews(path)
    assert len(reviews) >= least and sum(label for _, label in reviews) == len(reviews) / 2
    other = TYPICAL_FILE if path == HARD_FILE else HARD_FILE
    copies = near_copies(texts(path), texts(EXTRA_FILE) + texts(DATA_FILE) + texts(other))
    assert not copies, copies[:5]


def test_training_only_reviews_are_labelled_and_balanced() -> None:
    extra = read_reviews(EXTRA_FILE)
    positives = sum(label for _, label in extra)
    assert len(extra) > 500 and abs(positives - len(extra) / 2) < 0.05 * len(extra)
    assert len({normalized(text) for text, _ in extra}) == len(extra)
