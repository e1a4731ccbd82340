"""The forward captured for a few bucketed shapes (``capture`` in the handler settings), for the
lone request and small batches, whose time on a GPU is mostly the launch of each kernel.

A sub-batch of ``rows`` texts padded to ``length`` tokens runs at the smallest bucket that holds
it: rows a power of two up to ``capture_rows``, length a power of two from ``MIN_LENGTH`` up to
``max_length``. Extra positions hold the pad token with an attention mask of 0, extra rows one
unmasked pad token (a row with no key would be all-masked), so each text's logits are those of
the eager pass within float noise (``handler.model_check`` refuses a model whose logits move with
padding). A larger sub-batch runs eagerly.

- ``cuda_graphs``: one CUDA graph per bucket, recorded at worker start (``torch.cuda.graphs``)
  on static input buffers; a pass copies its inputs in and replays it. CUDA only.
- ``compile``: ``torch.compile`` with ``mode="reduce-overhead"`` (CUDA graphs of the compiled
  code on CUDA, inductor's code on the CPU) and ``dynamic=False``: one compiled graph per
  bucket, compiled at its first pass, so the shapes it ever sees are the buckets.

Off by default: whether it pays is measured on a GPU (``make gpu-report``, docs/gpu/).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

MIN_LENGTH = 16
Inputs = dict[str, torch.Tensor]


def powers_of_two(low: int, high: int) -> list[int]:
    """low, 2 low, ... up to the first power reaching ``high``, capped at ``high``."""
    values, value = [], low
    while value < high:
        values.append(value)
        value *= 2
    return [*values, high]


@dataclass(frozen=True)
class Buckets:
    rows: tuple[int, ...]
    lengths: tuple[int, ...]

    @classmethod
    def up_to(cls, max_rows: int, max_length: int) -> Buckets:
        return cls(
            tuple(powers_of_two(1, max_rows)),
            tuple(powers_of_two(min(MIN_LENGTH, max_length), max_length)),
        )

    def shapes(self) -> list[tuple[int, int]]:
        return [(rows, length) for rows in self.rows for length in self.lengths]

    def bucket_for(self, rows: int, length: int) -> tuple[int, int] | None:
        """The smallest bucket holding ``rows`` x ``length``, or None (run it eagerly)."""
        fit_rows = [r for r in self.rows if r >= rows]
        fit_lengths = [n for n in self.lengths if n >= length]
        if not fit_rows or not fit_lengths:
            return None
        return fit_rows[0], fit_lengths[0]


def padded_to(inputs: Inputs, shape: tuple[int, int], pad_id: int) -> Inputs:
    """``inputs`` (ids, mask, token types; same device) grown to ``shape``: pad tokens masked
    out on each row, extra rows of one unmasked pad token."""
    rows, length = inputs["input_ids"].shape
    target_rows, target_length = shape
    out: Inputs = {}
    for name, tensor in inputs.items():
        fill = pad_id if name == "input_ids" else 0
        grown = torch.full(
            (target_rows, target_length), fill, dtype=tensor.dtype, device=tensor.device
        )
        grown[:rows, :length] = tensor
        out[name] = grown
    out["attention_mask"][rows:, 0] = 1
    return out


class CudaGraphForward:
    """One CUDA graph per bucket over static buffers, recorded at construction."""

    def __init__(self, model: Any, buckets: Buckets, example: Inputs, pad_id: int) -> None:
        self.model, self.buckets, self.pad_id = model, buckets, pad_id
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Inputs, torch.Tensor]] = {}
        pool = None
        for shape in sorted(buckets.shapes(), reverse=True):  # the largest first: one shared pool
            static = padded_to({k: v[:1, :1] for k, v in example.items()}, shape, pad_id)
            static["attention_mask"][:, :1] = 1
            stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(2):  # warm-up outside the graph (allocations, kernel choice)
                    model(**static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool), torch.inference_mode():
                logits = model(**static).logits
            pool = graph.pool()
            self.graphs[shape] = (graph, static, logits)

    def __call__(self, inputs: Inputs) -> torch.Tensor | None:
        rows, length = inputs["input_ids"].shape
        shape = self.buckets.bucket_for(rows, length)
        if shape is None:
            return None
        graph, static, logits = self.graphs[shape]
        for name, tensor in padded_to(inputs, shape, self.pad_id).items():
            static[name].copy_(tensor)
        graph.replay()
        return logits[:rows].clone()


@dataclass
class CompiledForward:
    """``torch.compile`` of the model's forward, fed only bucket shapes."""

    model: Any
    buckets: Buckets
    pad_id: int
    compiled: Callable[..., Any] = field(init=False)

    def __post_init__(self) -> None:
        import torch._dynamo

        # One graph per bucket: dynamo must keep them all rather than fall back to eager.
        limit = len(self.buckets.shapes()) + 1
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, limit)
        self.compiled = torch.compile(self.model, mode="reduce-overhead", dynamic=False)

    def __call__(self, inputs: Inputs) -> torch.Tensor | None:
        rows, length = inputs["input_ids"].shape
        shape = self.buckets.bucket_for(rows, length)
        if shape is None:
            return None
        logits: torch.Tensor = self.compiled(**padded_to(inputs, shape, self.pad_id)).logits
        return logits[:rows].clone()


Captured = Callable[[Inputs], "torch.Tensor | None"]
"""Logits of a sub-batch on the device, or None where no bucket holds it (run it eagerly)."""


def check_capture(capture: str, device: torch.device) -> None:
    """``cuda_graphs`` needs CUDA; a worker on the CPU fails at start rather than serve eagerly."""
    if capture == "cuda_graphs" and device.type != "cuda":
        raise ValueError(
            f"capture cuda_graphs needs a CUDA GPU, and this worker runs on {device}; "
            "use capture: compile (torch.compile, also on the CPU) or eager"
        )


def build_capture(
    capture: str,
    model: Any,
    device: torch.device,
    buckets: Buckets,
    pad_id: int,
    uses_token_types: bool,
) -> Captured | None:
    """The captured forward of ``capture`` (``eager``: None)."""
    if capture == "eager":
        return None
    check_capture(capture, device)
    logger.info("capture %s for %d shapes: rows %s x lengths %s", capture,
                len(buckets.shapes()), list(buckets.rows), list(buckets.lengths))  # fmt: skip
    if capture == "compile":
        return CompiledForward(model, buckets, pad_id)
    example = {
        "input_ids": torch.full((1, 1), pad_id, dtype=torch.long, device=device),
        "attention_mask": torch.ones((1, 1), dtype=torch.long, device=device),
    }
    if uses_token_types:
        example["token_type_ids"] = torch.zeros((1, 1), dtype=torch.long, device=device)
    return CudaGraphForward(model, buckets, example, pad_id)
