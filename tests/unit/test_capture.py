"""The captured forward (handler/capture.py): bucketed shapes, padding that leaves each text's
logits as they were, and the captured path's scores equal to eager's where it can run
(``compile`` on the CPU; ``cuda_graphs`` where CUDA is)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handler.capture import Buckets, check_capture, padded_to, powers_of_two
from handler.inference import classify
from handler.model import load_model
from handler.settings import HandlerSettings

TEXTS = [
    "Fine.",
    "The service was slow but the food made up for it.",
    "Not for me.",
    "A long one: " + "the plot wanders and the acting holds it together " * 4,
]
"""Texts of several lengths, each alone within the one bucket of ``scores`` (16 tokens, truncated
there) and together in sub-batches of several rows (run eagerly)."""


def test_buckets_are_powers_of_two_up_to_the_limits() -> None:
    assert powers_of_two(1, 4) == [1, 2, 4]
    assert powers_of_two(16, 128) == [16, 32, 64, 128]
    assert powers_of_two(16, 100) == [16, 32, 64, 100]
    buckets = Buckets.up_to(4, 128)
    assert len(buckets.shapes()) == 12
    assert buckets.bucket_for(1, 5) == (1, 16)
    assert buckets.bucket_for(3, 17) == (4, 32)
    assert buckets.bucket_for(5, 16) is None
    assert buckets.bucket_for(1, 129) is None


def test_padding_to_a_bucket_masks_the_new_positions_and_gives_extra_rows_one_token() -> None:
    inputs = {
        "input_ids": torch.tensor([[101, 7, 102]]),
        "attention_mask": torch.tensor([[1, 1, 1]]),
    }
    grown = padded_to(inputs, (2, 5), pad_id=0)
    assert grown["input_ids"].tolist() == [[101, 7, 102, 0, 0], [0, 0, 0, 0, 0]]
    assert grown["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]


def test_cuda_graphs_are_refused_on_the_cpu_with_the_fix() -> None:
    with pytest.raises(ValueError, match="needs a CUDA GPU.*capture: compile"):
        check_capture("cuda_graphs", torch.device("cpu"))
    with pytest.raises(ValueError, match="capture must be one of"):
        HandlerSettings(capture="graphs")
    with pytest.raises(ValueError, match="capture_rows"):
        HandlerSettings(capture_rows=0)


def scores(model_dir: Path, device: str, capture: str) -> list[dict[str, float]]:
    settings = HandlerSettings(
        torch_threads=1,
        max_length=16,
        max_batch_tokens=64,
        capture=capture,
        capture_rows=1,
        device=device,
    )
    loaded = load_model(model_dir, settings, 0 if device == "cuda" else None)
    singles = [classify(loaded, [text], 16, 64)[0][0].scores for text in TEXTS]
    together = [p.scores for p in classify(loaded, TEXTS, 16, 64)[0]]
    return singles + together


def largest_change(got: list[dict[str, float]], expected: list[dict[str, float]]) -> float:
    return max(abs(a[k] - b[k]) for a, b in zip(got, expected, strict=True) for k in a)


def test_compiled_forward_scores_equal_eager_on_the_cpu(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.compile (inductor's code on the CPU) over the one bucket of one row and 16 tokens,
    each text alone (captured) and all together (sub-batches of several rows: eager), against
    the eager pass. About 25 s on an idle 2-core machine, nearly all of it inductor compiling
    its kernels (in this process: its worker pool only adds start-up on 2 cores): the one test
    of the captured path that runs without a GPU."""
    import torch._inductor.config

    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)
    eager = scores(tiny_model_dir, "cpu", "eager")
    compiled = scores(tiny_model_dir, "cpu", "compile")
    assert largest_change(compiled, eager) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_cuda_graph_scores_equal_eager_on_cuda(tiny_model_dir: Path) -> None:
    eager = scores(tiny_model_dir, "cuda", "eager")
    captured = scores(tiny_model_dir, "cuda", "cuda_graphs")
    assert largest_change(captured, eager) < 1e-5
