"""``precision: auto``: what the start settles on (``handler.precision.choose_precision``), how
the answers are held against fp32's, and how a worker takes the start's choice."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from handler.inference import classify
from handler.model import load_model, settled_precision
from handler.precision import (
    AGREEMENT,
    CHOSEN_ENV,
    CPU_SPEEDUP,
    SCORE_TOLERANCE,
    Hardware,
    agreement,
    choose_precision,
    chosen_for,
    chosen_text,
    cpu_has_native_bf16,
)
from handler.settings import HandlerSettings
from handler.values import Prediction

CPU_WITH_BF16 = Hardware("cpu", native_bf16=True)
CPU_WITHOUT_BF16 = Hardware("cpu", native_bf16=False)
GPU_WITH_BF16 = Hardware("cuda", native_bf16=True)
GPU_WITHOUT_BF16 = Hardware("cuda", native_bf16=False)
TEXTS = [f"text number {i}, {'good ' * (i % 7)}{'bad ' * (i % 5)}" for i in range(100)]


def prediction(positive: float) -> Prediction:
    scores = {"negative": 1.0 - positive, "positive": positive}
    return Prediction(
        label=max(scores, key=scores.__getitem__),
        score=max(scores.values()),
        scores=scores,
        truncated=False,
    )


class Trial:
    """A stand-in model per precision: ``answers`` gives each precision's predictions."""

    def __init__(self, answers: dict[str, list[Prediction]], speedup: float = 2.0) -> None:
        self.answers, self.ratio, self.loaded = answers, speedup, []

    def load(self, precision: str) -> str:
        self.loaded.append(precision)
        return precision

    def run(self, hardware: Hardware) -> Any:
        return choose_precision(
            hardware, self.load, lambda model: self.answers[model], lambda fast, exact: self.ratio
        )


EXACT = [prediction(0.1 + 0.8 * i / 99) for i in range(100)]
CLOSE = [prediction(p.scores["positive"] + 0.004) for p in EXACT]


def test_a_cpu_without_native_bf16_stays_fp32_without_loading_anything() -> None:
    trial = Trial({"fp32": EXACT, "bf16": CLOSE})
    choice = trial.run(CPU_WITHOUT_BF16)
    assert choice.precision == "fp32" and "no native bf16" in choice.why
    assert trial.loaded == []


def test_a_cpu_with_native_bf16_takes_it_where_it_is_faster_and_the_answers_hold() -> None:
    choice = Trial({"fp32": EXACT, "bf16": CLOSE}, speedup=1.9).run(CPU_WITH_BF16)
    assert choice.precision == "bf16"
    assert "1.90x fp32's texts/s" in choice.why and "kept on 100 of 100" in choice.why


def test_bf16_that_is_not_faster_on_this_cpu_is_not_taken() -> None:
    slow = CPU_SPEEDUP - 0.05
    choice = Trial({"fp32": EXACT, "bf16": CLOSE}, speedup=slow).run(CPU_WITH_BF16)
    assert choice.precision == "fp32" and f"{slow:.2f}x" in choice.why


@pytest.mark.parametrize(
    ("hardware", "candidate"), [(GPU_WITH_BF16, "bf16"), (GPU_WITHOUT_BF16, "fp16")]
)
def test_a_gpu_takes_its_native_half_precision_without_timing_it(
    hardware: Hardware, candidate: str
) -> None:
    trial = Trial({"fp32": EXACT, candidate: CLOSE}, speedup=0.5)
    assert trial.run(hardware).precision == candidate
    assert trial.loaded == ["fp32", candidate]


def test_answers_that_do_not_hold_keep_fp32_and_say_why() -> None:
    flipped = list(CLOSE)
    for index in range(math.floor(len(EXACT) * (1 - AGREEMENT)) + 1):
        flipped[index] = prediction(1.0 - EXACT[index].scores["positive"])
    choice = Trial({"fp32": EXACT, "bf16": flipped}).run(CPU_WITH_BF16)
    assert choice.precision == "fp32"
    assert "the decision changed on 2 of 100 texts" in choice.why


@pytest.mark.parametrize(
    ("fast", "problem"),
    [
        ([prediction(p.scores["positive"]) for p in EXACT], None),
        (
            EXACT[:-1] + [prediction(EXACT[-1].scores["positive"] - SCORE_TOLERANCE - 0.01)],
            "a score moved by",
        ),
        ([prediction(math.nan)] + CLOSE[1:], "not finite"),
    ],
)
def test_the_answers_hold_only_finite_and_within_the_tolerance(
    fast: list[Prediction], problem: str | None
) -> None:
    found = agreement(EXACT, fast).problem()
    assert found is None if problem is None else problem in (found or "")


def test_the_tolerance_of_logits_follows_their_scale() -> None:
    """A regression's values of about 50 may move by 0.1 x 50 (its scale), not 0.1."""
    exact = [Prediction("value", 50.0, {"value": 50.0}, False)]
    fast = [Prediction("value", 52.0, {"value": 52.0}, False)]
    assert agreement(exact, fast).problem() is None
    fast = [Prediction("value", 56.0, {"value": 56.0}, False)]
    assert "moved by 6" in (agreement(exact, fast).problem() or "")


def test_a_worker_takes_the_starts_choice_for_its_own_model_else_fp32() -> None:
    environ = {CHOSEN_ENV: chosen_text({"bert:1.0": "bf16", "toxic:2.0": "fp32"})}
    assert chosen_for("bert:1.0", environ) == "bf16" and chosen_for("toxic:2.0", environ) == "fp32"
    auto = HandlerSettings()
    assert auto.precision == "auto"
    settled, why = settled_precision(auto, "bert:1.0", environ)
    assert settled.precision == "bf16" and "the start's choice" in why
    settled, why = settled_precision(auto, "other:1.0", environ)
    assert settled.precision == "fp32" and CHOSEN_ENV in why
    pinned = replace(auto, precision="fp32")
    assert settled_precision(pinned, "bert:1.0", environ)[0].precision == "fp32"
    assert chosen_for("bert:1.0", {CHOSEN_ENV: "bert:1.0=fp64"}) is None


def cancelling_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny classifier with both logits lifted by 1000 and the second one's weights made the
    first's plus a small difference: in fp32 the texts split on that difference, in bf16 (8 bits
    of mantissa: steps of 4 at 1000) it is rounded away, a stand-in for a model that breaks in
    reduced precision."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    head = model.classifier
    with torch.no_grad():
        head.weight[1] = head.weight[0] + 0.02 * head.weight[1]
        head.bias[:] = 1000.0
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
def test_a_model_that_breaks_in_bf16_is_served_in_fp32_with_the_reason(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = cancelling_model(tiny_model_dir, tmp_path / "cancelling")
    settings = HandlerSettings(device="cpu", max_batch_tokens=2048)

    def load(precision: str) -> Any:
        return load_model(folder, replace(settings, precision=precision), None)

    def answers(loaded: Any) -> list[Prediction]:
        return classify(loaded, TEXTS, settings.max_length, loaded.max_batch_tokens)[0]

    exact = answers(load("fp32"))
    assert len({p.label for p in exact}) == 2, "fp32 tells the texts apart"
    choice = choose_precision(CPU_WITH_BF16, load, answers, lambda fast, exact: 2.0)
    assert choice.precision == "fp32"
    assert "but in bf16 the decision changed on" in choice.why
