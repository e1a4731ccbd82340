"""Stages 2 and 3: tokenize the valid texts of a batch together, run them, score them.

Texts are tokenized once per batch without padding, then grouped by length into
sub-batches whose padded size (rows x longest row) stays under ``max_batch_tokens``, so one
long text does not make every short batch-mate pay for its padding. When the whole batch
fits the budget it is one forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from handler.model import LoadedModel


@dataclass(frozen=True)
class TokenizedText:
    input_ids: list[int]
    truncated: bool


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    scores: dict[str, float]
    truncated: bool


@dataclass
class BatchStats:
    """What one batch cost; logged per batch and used by the metrics."""

    texts: int = 0
    sub_batches: list[int] = field(default_factory=list)
    real_tokens: int = 0
    padded_tokens: int = 0
    tokenize_ms: float = 0.0
    forward_ms: float = 0.0


def tokenize(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[TokenizedText]:
    """One tokenizer call for the whole batch, truncated at ``max_length``, not padded."""
    encoded = tokenizer(
        list(texts),
        truncation=True,
        max_length=max_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    return [
        TokenizedText(input_ids=list(ids), truncated=bool(encoding.overflowing))
        for ids, encoding in zip(encoded["input_ids"], encoded.encodings, strict=True)
    ]


def plan_sub_batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Group indices, shortest first, so that rows x longest row <= max_batch_tokens."""
    groups: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and (len(current) + 1) * lengths[index] > max_batch_tokens:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


def collate(rows: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest row of this group: input ids and attention mask on the CPU."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for position, row in enumerate(rows):
        input_ids[position, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[position, : len(row)] = 1
    return input_ids, attention_mask


def forward(
    loaded: LoadedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> list[list[float]]:
    """Class probabilities per row, as plain floats: one move to the device and one back.

    On CUDA the host tensors are pinned (when enabled) so the copy can be asynchronous, and the
    forward runs under fp16 autocast when ``half_precision`` is on; softmax is always float32.
    """
    device = loaded.device
    on_cuda = device.type == "cuda"
    if on_cuda and loaded.pin_memory:
        input_ids, attention_mask = input_ids.pin_memory(), attention_mask.pin_memory()
    with (
        torch.inference_mode(),
        torch.autocast(
            device_type=device.type, dtype=torch.float16, enabled=on_cuda and loaded.half_precision
        ),
    ):
        logits = loaded.model(
            input_ids=input_ids.to(device, non_blocking=on_cuda),
            attention_mask=attention_mask.to(device, non_blocking=on_cuda),
        ).logits
        probabilities = torch.softmax(logits.float(), dim=-1)
    rows: list[list[float]] = probabilities.cpu().tolist()
    return rows


def to_prediction(
    probabilities: Sequence[float], labels: Sequence[str], truncated: bool
) -> Prediction:
    best = max(range(len(probabilities)), key=lambda i: probabilities[i])
    return Prediction(
        label=labels[best],
        score=float(probabilities[best]),
        scores={label: float(p) for label, p in zip(labels, probabilities, strict=True)},
        truncated=truncated,
    )


def classify(
    loaded: LoadedModel, texts: Sequence[str], max_length: int, max_batch_tokens: int
) -> tuple[list[Prediction], BatchStats]:
    """Predictions in the order of ``texts``; may raise if the model fails."""
    stats = BatchStats(texts=len(texts))
    if not texts:
        return [], stats
    started = time.perf_counter()
    tokenized = tokenize(loaded.tokenizer, texts, max_length)
    stats.tokenize_ms = (time.perf_counter() - started) * 1000
    lengths = [len(item.input_ids) for item in tokenized]
    probabilities: list[list[float]] = [[] for _ in texts]
    started = time.perf_counter()
    for group in plan_sub_batches(lengths, max_batch_tokens):
        input_ids, attention_mask = collate(
            [tokenized[i].input_ids for i in group], loaded.tokenizer.pad_token_id
        )
        for index, row in zip(group, forward(loaded, input_ids, attention_mask), strict=True):
            probabilities[index] = row
        stats.sub_batches.append(len(group))
        stats.real_tokens += sum(lengths[i] for i in group)
        stats.padded_tokens += input_ids.numel()
    stats.forward_ms = (time.perf_counter() - started) * 1000
    predictions = [
        to_prediction(probabilities[i], loaded.labels, tokenized[i].truncated)
        for i in range(len(texts))
    ]
    return predictions, stats
