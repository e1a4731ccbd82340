"""Small offline classifiers, one per kind of head, and the reference answer for each.

Every kind a team may bring: single-label, multi-label, one logit (a reranker or quality
score), regression, and a sentence-pair classifier. ``tiny`` models are a 2-layer, 32-wide
BERT with random weights drawn wide (see ``tests/conftest.py::tiny_model_dir``) so that
texts score far apart; ``minilm`` models put a random head on the real pretrained MiniLM
encoder, for realistic lengths and activations. Weights never matter for exactness: the
handler must give what transformers' own pipeline gives for the same folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    pipeline,
)
from transformers.utils import logging as transformers_logging

from handler.settings import HandlerSettings
from tests.conftest import encoder_dir

transformers_logging.disable_progress_bar()


SERVED_STRIDE = HandlerSettings().stride
"""What a served model windows long texts with by default (``long_texts: windows``)."""


@dataclass(frozen=True)
class Head:
    labels: tuple[str, ...]
    problem_type: str | None


ITEMS: list[str | tuple[str, str]] = [
    "Fine.",
    "The service was slow but the food made up for it.",
    ("A man is playing a guitar on stage.", "Someone is making music."),
    ("short", "a considerably longer second text about many unrelated things " * 3),
    "Brilliant! " * 80,
    ("premise " * 200, "the hypothesis stays whole"),
    "Not for me.",
    ("Is it raining?", "The streets are wet."),
    ("Which one is long?", "the second text of this pair, " * 30),
]
"""Texts and pairs of many lengths; three are over 128 tokens: a text, a pair with a long
first text and one with a long second text."""

HEADS: dict[str, Head] = {
    "single_label": Head(("negative", "neutral", "positive"), None),
    "multi_label": Head(
        ("toxic", "insult", "threat", "spam", "off_topic"), "multi_label_classification"
    ),
    "one_logit": Head(("relevant",), None),
    "regression": Head(("similarity",), "regression"),
    "pair": Head(("entailment", "neutral", "contradiction"), "single_label_classification"),
}


TINY_ENCODERS: dict[str, tuple[Any, Any, dict[str, int]]] = {
    "tiny": (
        BertConfig,
        BertForSequenceClassification,
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
        },
    ),
    "tiny-distilbert": (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64},
    ),
}
"""2 layers, 32 wide; their weights are drawn 15x wider than BERT's usual 0.02 (the
``initializer_range``), so that different texts score far apart."""


def build_head_model(out: Path, head: str | Head, encoder: str = "tiny", seed: int = 0) -> Path:
    """Save a classifier with this head (a kind of ``HEADS``, or a ``Head``) and the MiniLM
    tokenizer into ``out``. ``encoder``: ``tiny`` (BERT), ``tiny-distilbert`` (a model whose
    tokenizer has no token type ids) or ``minilm`` (the real pretrained encoder)."""
    head = HEADS[head] if isinstance(head, str) else head
    torch.manual_seed(seed)
    tokenizer_options = {}
    if encoder == "tiny-distilbert":
        tokenizer_options["model_input_names"] = ["input_ids", "attention_mask"]
    tokenizer = AutoTokenizer.from_pretrained(
        encoder_dir(), local_files_only=True, **tokenizer_options
    )
    label_config: dict[str, Any] = {
        "num_labels": len(head.labels),
        "id2label": dict(enumerate(head.labels)),
        "label2id": {label: i for i, label in enumerate(head.labels)},
        "problem_type": head.problem_type,
    }
    model: Any
    if encoder in TINY_ENCODERS:
        config_class, model_class, sizes = TINY_ENCODERS[encoder]
        config = config_class(
            vocab_size=tokenizer.vocab_size, initializer_range=0.3, **sizes, **label_config
        )
        model = model_class(config)
    else:
        model = BertForSequenceClassification.from_pretrained(
            encoder_dir(), local_files_only=True, use_safetensors=True, **label_config
        )
        with torch.no_grad():
            # The head is new: drawn wider than BERT's 0.02 so that texts score apart.
            model.classifier.weight.normal_(0.0, 0.5)
            model.classifier.bias.normal_(0.0, 0.5)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def reference_pipeline(model_dir: Path, **options: Any) -> Any:
    """transformers' text-classification pipeline on the CPU in fp32, every label answered."""
    return pipeline(
        "text-classification", model=str(model_dir), top_k=None, device="cpu", **options
    )


def reference_scores(
    classifier: Any, item: str | tuple[str, str], max_length: int = 128
) -> dict[str, float]:
    """Label -> score as the pipeline answers one text or pair, truncated at ``max_length``
    the way the pipeline does when asked to (``truncation=True``)."""
    inputs: Any = item if isinstance(item, str) else {"text": item[0], "text_pair": item[1]}
    answer = classifier(inputs, top_k=None, truncation=True, max_length=max_length)
    return {entry["label"]: float(entry["score"]) for entry in answer}


def largest_difference(got: dict[str, float], expected: dict[str, float]) -> float:
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    return max(abs(got[label] - expected[label]) for label in expected)


class Reference:
    """The pipeline's answers for one model folder, computed once per item; with ``stride``,
    a long item's windows combined as docs/api.md (Long texts) says (``windowed_scores``)."""

    def __init__(
        self, model_dir: Path, max_length: int = 128, stride: int | None = None, **options: Any
    ) -> None:
        self.classifier = reference_pipeline(model_dir, **options)
        self.max_length = max_length
        self.stride = stride
        self.cache: dict[Any, dict[str, float]] = {}

    def __call__(self, item: str | tuple[str, str]) -> dict[str, float]:
        if item not in self.cache:
            windowed = None
            if self.stride is not None:
                windowed = windowed_scores(self.classifier, item, self.max_length, self.stride)
            self.cache[item] = windowed or reference_scores(self.classifier, item, self.max_length)
        return self.cache[item]


def windowed_scores(
    classifier: Any,
    item: str | tuple[str, str],
    max_length: int,
    stride: int,
    multi_label: str = "mean",
) -> dict[str, float] | None:
    """Label -> score of an item classified as windows, recomputed with transformers alone:
    the tokenizer's windows (``return_overflowing_tokens`` with ``stride``; a pair
    ``only_second``), each scored by the pipeline's function, combined: a single-label model's
    most confident window; else per label the mean weighted by each window's tokens (its
    attention mask's sum), or a multi-label model's max with ``multi_label="max"``. None for an item
    of one window, and for a pair whose first text leaves the second no more than ``stride``
    tokens a window (the server truncates those as the pipeline does)."""
    tokenizer, model = classifier.tokenizer, classifier.model
    if isinstance(item, tuple):
        first = len(tokenizer(item[0], add_special_tokens=False)["input_ids"])
        if max_length - tokenizer.num_special_tokens_to_add(pair=True) - first <= stride:
            return None
        text, pair, truncation = item[0], item[1], "only_second"
    else:
        text, pair, truncation = item, None, True
    encoded = tokenizer(
        text,
        pair,
        truncation=truncation,
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        padding=True,
        return_tensors="pt",
    )
    encoded.pop("overflow_to_sample_mapping", None)
    if encoded["input_ids"].shape[0] == 1:
        return None
    with torch.no_grad():
        logits = model(**encoded).logits.float()
    config = model.config
    multi = config.problem_type == "multi_label_classification"
    if config.problem_type == "regression":
        scores = logits
    elif multi or config.num_labels == 1:
        scores = torch.sigmoid(logits)
    else:
        scores = torch.softmax(logits, dim=-1)
    weights = encoded["attention_mask"].sum(-1).double()
    if scores.shape[1] > 1 and not multi and config.problem_type != "regression":
        combined = scores[int(scores.max(dim=1).values.argmax())].double()
    elif multi and multi_label == "max":
        combined = scores.max(dim=0).values.double()
    else:
        combined = (scores.double() * weights[:, None]).sum(0) / weights.sum()
    labels = [config.id2label[i] for i in range(config.num_labels)]
    return {label: float(value) for label, value in zip(labels, combined, strict=True)}
