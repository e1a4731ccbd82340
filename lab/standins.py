"""Stand-ins for hardware this machine is not: the default model's tokenizer and labels on a
BERT of another shape, randomly initialised. A model whose batches take a tenth of the
default's behaves, to the server, like the default model on a machine about 10x faster; a
bert-base-sized one like a slower machine. Their labels mean nothing; their speed is the point.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SHAPES: dict[str, dict[str, int]] = {
    "fast": {
        "num_hidden_layers": 1,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "intermediate_size": 512,
    },
    "slow": {
        "num_hidden_layers": 12,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
}
"""fast: one layer of hidden size 128 (a machine
about 10x faster); slow: bert-base's 12 x 768 (a machine about 7x slower)."""


def reshaped(
    model_dir: Path,
    out: Path,
    shape: str,
    head_std: float | None = None,
    labels: tuple[str, ...] | None = None,
) -> Path:
    """``model_dir``'s tokenizer and labels (or ``labels``) on a BERT of ``SHAPES[shape]``
    (seeded), saved in ``out``; ``head_std``: the classifier head drawn that wide (BERT draws
    0.02), so that scores spread over (0, 1) and a change in the logits shows in them."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    for key, value in SHAPES[shape].items():
        setattr(config, key, value)
    if labels:
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    if head_std is not None:
        with torch.no_grad():
            model.classifier.weight.normal_(0.0, head_std)
            model.classifier.bias.zero_()
    model.save_pretrained(out, safe_serialization=True)
    for item in model_dir.iterdir():
        if "token" in item.name or item.name == "vocab.txt":
            shutil.copy2(item, out / item.name)
    return out
