"""The forward-pass budget measured at worker start (``handler.model.measured_budget``),
tested on devices this machine is not by a forward pass of a chosen cost."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from handler import model as model_module
from handler.inference import classify
from handler.model import FIXED_SHARE, load_model, measured_budget
from handler.settings import HandlerSettings

MAX_LENGTH = 128
CAP = 64 * MAX_LENGTH


class PassClock:
    """The clock ``pass_cost`` reads, moved on by the faked forward pass alone: the measured
    cost is exactly the chosen one, however busy the machine (a ``time.sleep`` of a few ms
    overshoots by the scheduler's delay on a loaded 2-core machine, which moved the budget by
    more than a quarter)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def costing(clock: PassClock, fixed_s: float, per_token_s: float):
    """A forward pass that takes ``fixed_s`` plus ``per_token_s`` per padded token."""

    def forward(loaded, input_ids: torch.Tensor, attention_mask: torch.Tensor, *_):
        clock.now += fixed_s + per_token_s * input_ids.numel()
        return torch.zeros(input_ids.shape[0], 2)

    return forward


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path):
    return load_model(tiny_model_dir, HandlerSettings(max_batch_tokens=256), None)


@pytest.mark.parametrize(
    ("fixed_s", "per_token_s", "expected"),
    [
        pytest.param(0.004, 40e-6, 900, id="a CPU: the fixed cost is 100 tokens' worth"),
        pytest.param(0.02, 0.0, CAP, id="a GPU: the pass costs the same whatever its tokens"),
        pytest.param(0.0, 50e-6, MAX_LENGTH, id="no fixed cost: every text on its own"),
    ],
)
def test_the_budget_is_where_the_fixed_cost_is_a_tenth_of_a_pass(
    tiny, monkeypatch: pytest.MonkeyPatch, fixed_s: float, per_token_s: float, expected: int
) -> None:
    clock = PassClock()
    monkeypatch.setattr(model_module, "time", clock)
    monkeypatch.setattr(model_module, "forward", costing(clock, fixed_s, per_token_s))
    budget, why = measured_budget(tiny, MAX_LENGTH, CAP)
    assert budget == expected
    assert MAX_LENGTH <= budget <= CAP
    assert why.startswith(f"max_batch_tokens {budget}: ")
    if MAX_LENGTH < budget < CAP:
        # a pass of the budget's tokens spends FIXED_SHARE of its time on the fixed part
        assert fixed_s / (fixed_s + per_token_s * budget) == pytest.approx(FIXED_SHARE)


def test_a_stated_budget_is_kept_and_nothing_is_measured(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_):
        raise AssertionError("measured although the setting states a budget")

    monkeypatch.setattr(model_module, "measured_budget", refuse)
    loaded = load_model(tiny_model_dir, HandlerSettings(max_batch_tokens=300), None)
    assert loaded.max_batch_tokens == 300


def test_the_default_budget_is_measured_at_load_and_serves_like_one_pass(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the default setting (0) the loaded model carries a measured budget within its
    bounds, says why in the log, and answers what a batch run as one pass answers."""
    settings = HandlerSettings()
    with caplog.at_level("INFO", logger="handler.model"):
        loaded = load_model(tiny_model_dir, settings, None)
    cap = settings.max_texts_per_request * settings.max_length
    assert settings.max_length <= loaded.max_batch_tokens <= cap
    assert f"max_batch_tokens {loaded.max_batch_tokens}: a pass costs" in caplog.text
    texts = ["short", "a little longer text " * 4, "the longest of the three " * 20]
    measured, _ = classify(loaded, texts, settings.max_length, loaded.max_batch_tokens)
    one_pass, _ = classify(replace(loaded, max_batch_tokens=cap), texts, settings.max_length, cap)
    for got, want in zip(measured, one_pass, strict=True):
        assert got.label == want.label
        assert got.scores == pytest.approx(want.scores, abs=1e-5)
