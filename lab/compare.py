"""``make compare-precision``: fp32 against a faster precision on your own texts, so the choice
is made with numbers: texts/s of each, the largest score change, the texts whose decision
changes, and whether ``precision: auto``'s check (``handler.precision.agreement``) would keep it. Both run the handler's ``classify`` in this process with the model config's settings,
in windows of one served batch, on the device a worker would take (fp32 on CUDA is IEEE fp32).

    python -m lab compare-precision --model-dir build/bert-sentiment --texts my_texts.txt

``--texts``: one text a line; without it, the benchmark corpus.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from bert_serve_server.archive import DEFAULT_MODEL_DIR, MODEL_CONFIG

from handler.inference import classify
from handler.model import LoadedModel, load_model
from handler.precision import agreement, decision, largest_change
from handler.settings import PRECISION_CHOICES, HandlerSettings
from handler.values import Prediction
from lab.corpus import make_corpus
from lab.report import write_json

EXAMPLE_CHARS = 160


@dataclass(frozen=True)
class Pass:
    """Texts/s over repeated passes of the texts, and the first pass's predictions."""

    texts_per_s: float
    predictions: list[Prediction]


def config_settings(model_config: Path = MODEL_CONFIG) -> HandlerSettings:
    """The handler settings a worker would start with, from the model config."""
    document = yaml.safe_load(model_config.read_text()) or {}
    return HandlerSettings.from_mapping(document.get("handler"))


def precision_choices(cuda: bool) -> tuple[str, ...]:
    """The precisions to compare with fp32 on this machine: ``tf32`` only where CUDA is."""
    return tuple(p for p in PRECISION_CHOICES if p != "fp32" and (cuda or p != "tf32"))


def timed_passes(
    loaded: LoadedModel,
    texts: Sequence[str],
    settings: HandlerSettings,
    batch_size: int,
    seconds: float,
) -> Pass:
    """Classify ``texts`` in ``batch_size`` windows, repeating whole passes for ``seconds``
    (at least one), after one window of warm-up."""
    windows = [texts[start : start + batch_size] for start in range(0, len(texts), batch_size)]
    classify(loaded, windows[0], settings.max_length, loaded.max_batch_tokens)
    predictions: list[Prediction] = []
    done = 0
    started = time.perf_counter()
    while not predictions or time.perf_counter() - started < seconds:
        this_pass = []
        for window in windows:
            got, _ = classify(loaded, window, settings.max_length, loaded.max_batch_tokens)
            this_pass += got
        predictions = predictions or this_pass
        done += len(texts)
    return Pass(round(done / (time.perf_counter() - started), 1), predictions)


def flips(
    texts: Sequence[str], exact: Sequence[Prediction], fast: Sequence[Prediction], precision: str
) -> list[dict[str, Any]]:
    """The texts whose decision differs, largest score change first."""
    changed = [
        (largest_change(e, f), text, e, f)
        for text, e, f in zip(texts, exact, fast, strict=True)
        if decision(e) != decision(f)
    ]
    changed.sort(key=lambda item: item[0], reverse=True)
    return [
        {
            "text": text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + "...",
            "fp32": {"labels": list(decision(e)), "score": round(e.score, 4)},
            precision: {"labels": list(decision(f)), "score": round(f.score, 4)},
        }
        for _, text, e, f in changed
    ]


def compare_precision(
    model_dir: Path,
    texts: Sequence[str],
    precision: str = "bf16",
    settings: HandlerSettings | None = None,
    batch_size: int = 16,
    seconds: float = 5.0,
    examples: int = 5,
    gpu_id: int | None = None,
) -> dict[str, Any]:
    """fp32 and ``precision`` on ``texts``: speed, score changes and label flips, as JSON data.
    ``gpu_id`` is the GPU TorchServe would assign (None: the CPU); each load sets the matmul
    precision of its own, as a worker does at start.

    Raises ``ValueError`` (from the handler's start-up check) when this machine cannot run
    ``precision``."""
    if not texts:
        raise ValueError("no texts to compare on")
    base = replace(settings or config_settings(), precision="fp32")
    runs = {}
    device = "cpu"
    for name in ("fp32", precision):
        loaded = load_model(model_dir, replace(base, precision=name), gpu_id=gpu_id)
        device = str(loaded.device)
        runs[name] = timed_passes(loaded, texts, base, batch_size, seconds)
    exact, fast = runs["fp32"].predictions, runs[precision].predictions
    changed = flips(texts, exact, fast, precision)
    unchanged = len(texts) - len(changed)
    return {
        "model_dir": str(model_dir),
        "device": device,
        "texts": len(texts),
        "batch_size": batch_size,
        "torch_threads": base.torch_threads,
        "max_batch_tokens": base.max_batch_tokens,
        "texts_per_s": {name: run.texts_per_s for name, run in runs.items()},
        "speedup": round(runs[precision].texts_per_s / runs["fp32"].texts_per_s, 2),
        "largest_score_change": round(
            max(largest_change(e, f) for e, f in zip(exact, fast, strict=True)), 5
        ),
        "labels_unchanged": unchanged,
        "labels_unchanged_pct": round(100 * unchanged / len(texts), 2),
        "labels_flipped": len(changed),
        "flip_examples": changed[:examples],
        "auto_would_keep_it": agreement(exact, fast).problem() or "yes: the answers hold",
    }


def summary(result: dict[str, Any]) -> str:
    """The comparison in a few lines for a terminal."""
    (exact_name, exact_rate), (fast_name, fast_rate) = result["texts_per_s"].items()
    lines = [
        f"{result['texts']} texts on {result['device']}, batches of {result['batch_size']}, "
        f"{result['torch_threads'] or 'default'} torch thread(s):",
        f"  {exact_name}: {exact_rate} texts/s   {fast_name}: {fast_rate} texts/s "
        f"({result['speedup']}x)",
        f"  largest score change: {result['largest_score_change']}",
        f"  labels unchanged: {result['labels_unchanged']} of {result['texts']} "
        f"({result['labels_unchanged_pct']} %), flipped: {result['labels_flipped']}",
        f"  precision auto would keep {fast_name} on these texts: {result['auto_would_keep_it']}",
    ]
    for example in result["flip_examples"]:
        before, after = example[exact_name], example[fast_name]
        lines.append(
            f"    {before['labels']} {before['score']} -> {after['labels']} {after['score']}: "
            f"{example['text']!r}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(
        prog="python -m lab compare-precision",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--texts", type=Path, help="one text per line (default: the corpus)")
    parser.add_argument("--precision", choices=precision_choices(cuda), default="bf16")
    parser.add_argument("--model-config", type=Path, default=MODEL_CONFIG)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5, help="timed passes per precision")
    parser.add_argument("--out", type=Path, default=Path("build/compare-precision.json"))
    args = parser.parse_args(argv)
    texts = make_corpus()
    if args.texts:
        texts = [
            line for line in args.texts.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    settings = config_settings(args.model_config)
    try:
        result = compare_precision(
            args.model_dir, texts, args.precision, settings, args.batch_size, args.seconds,
            gpu_id=0 if cuda else None,
        )  # fmt: skip
    except ValueError as error:
        print(f"cannot compare: {error}", file=sys.stderr)
        return 2
    write_json(args.out, result)
    print(summary(result))
    print(f"wrote {args.out}")
    return 0
