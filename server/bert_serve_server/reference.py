"""The reference profile an archive carries: what the model says on texts the user gives,
computed when the archive is packaged, in the terms of the handler's model metrics
(``handler.model_metrics``), so live and reference can be put side by side in PromQL.

    python -m bert_serve_server package --model-dir DIR --reference texts.txt

The texts file holds one text a line (blank lines skipped); a line with a tab is a text
pair, tokenized as the pair route does. The model runs as the handler config packed beside
it says (precision, max_length, labels, score function), on the CPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

CHUNK = 64
"""Texts per forward call while profiling."""


def read_texts(path: Path) -> list[str | tuple[str, str]]:
    """One text a line; a tab makes a (text, text_pair)."""
    texts: list[str | tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        first, tab, second = line.partition("\t")
        texts.append((first, second) if tab else line)
    if not texts:
        raise SystemExit(f"{path}: no texts (one a line)")
    return texts


def reference_profile(model_dir: Path, model_config: Path, texts_file: Path) -> str:
    """The profile's JSON text (``handler.model_metrics.Profile``)."""
    from handler.inference import classify
    from handler.model import head_kind, load_model
    from handler.model_metrics import profile
    from handler.settings import HandlerSettings

    document = yaml.safe_load(model_config.read_text()) or {}
    settings = HandlerSettings.from_mapping(document.get("handler"))
    budget = settings.max_batch_tokens or settings.max_length * 16
    settings = dataclasses.replace(settings, device="cpu", max_batch_tokens=budget)
    loaded = load_model(model_dir, settings, None)
    texts = read_texts(texts_file)
    too_long = [
        t for t in texts if sum(map(len, t if isinstance(t, tuple) else (t,))) > settings.max_chars
    ]
    if too_long:
        raise SystemExit(
            f"{texts_file}: {len(too_long)} texts have more than max_chars "
            f"({settings.max_chars}) characters, which the server refuses; shorten or drop them"
        )
    predictions, tokens = [], []
    for start in range(0, len(texts), CHUNK):
        chunk = texts[start : start + CHUNK]
        found, stats = classify(loaded, chunk, settings.max_length, budget)
        predictions += found
        tokens += stats.text_tokens
    return profile(predictions, tokens, head_kind(loaded), loaded.labels).to_json()
