"""Explanations: which tokens made a label, one text at a time, as TorchServe's stock handler
computes them (docs/api.md). ``Budget`` keeps a batch's explanations within a share of
``responseTimeout``, past which TorchServe kills the worker and fails the whole batch."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from handler.inference import model_inputs, tokenize
from handler.model import LoadedModel, apply_score_function
from handler.settings import HandlerSettings
from handler.values import (
    ErrorCode,
    ExplainOptions,
    Explanation,
    Rejected,
    TextInput,
    TokenizedText,
)

logger = logging.getLogger(__name__)


def baseline_ids(tokenized: TokenizedText, pad_id: int) -> list[int]:
    """The same tokens, each of the text's own (not special) replaced by the pad token."""
    mask = tokenized.special_tokens_mask or [0] * len(tokenized.input_ids)
    return [
        token if special else pad_id
        for token, special in zip(tokenized.input_ids, mask, strict=True)
    ]


def internal_batch_size(settings: HandlerSettings, max_batch_tokens: int, tokens: int) -> int:
    """Steps per pass: the setting, or as many rows of this text as ``max_batch_tokens`` holds."""
    if settings.explain_internal_batch_size:
        return settings.explain_internal_batch_size
    return max(1, max_batch_tokens // tokens)


def target_index(target: str | int | None, labels: tuple[str, ...], best: int) -> int | Rejected:
    """The class to explain: by name or index, else the predicted one."""
    if target is None:
        return best
    if isinstance(target, str):
        if target in labels:
            return labels.index(target)
        return Rejected(
            ErrorCode.INVALID_OPTION, f'"target" {target!r} is not a label; labels: {list(labels)}'
        )
    if 0 <= target < len(labels):
        return target
    return Rejected(
        ErrorCode.INVALID_OPTION,
        f'"target" {target} is not a class index; the model has {len(labels)} (0 to {len(labels) - 1})',
    )


BUDGET_SHARE = 0.5
"""Of ``responseTimeout``; the rest is for the batch's predictions and the estimate's error."""
DEFAULT_RESPONSE_TIMEOUT_S = 120.0
"""TorchServe's own default, for a model config that sets none."""
CALIBRATION_TEXT = "a short text to time one explanation step at worker start"
CALIBRATION_STEPS = 4
CALIBRATION_RUNS = 3
"""Small explanations timed one after another; the fastest sets the pace. The first pays the
worker's cold start, and on a shared machine any one run can fall in another process's burst."""


@dataclass
class Budget:
    """The seconds a batch's explanations may take, and this worker's pace at them."""

    seconds: float
    per_token_step: float | None = None
    """Seconds per token per step, smoothed over the explanations measured."""
    refused: bool = False
    """Whether a text was refused on this budget's estimate."""

    @classmethod
    def for_timeout(cls, response_timeout_s: float | None) -> Budget:
        timeout = DEFAULT_RESPONSE_TIMEOUT_S if response_timeout_s is None else response_timeout_s
        return cls(seconds=BUDGET_SHARE * float(timeout))

    def estimate(self, tokens: int, steps: int) -> float:
        return (self.per_token_step or 0.0) * tokens * steps

    def record(self, tokens: int, steps: int, seconds: float) -> None:
        measured = seconds / max(1, tokens * steps)
        previous = self.per_token_step
        self.per_token_step = measured if previous is None else 0.7 * previous + 0.3 * measured

    def calibrate(self, loaded: LoadedModel, settings: HandlerSettings) -> None:
        """Small explanations timed (``CALIBRATION_RUNS``), so that the first text explained
        has an estimate: the fastest one's pace."""
        options = ExplainOptions(n_steps=min(CALIBRATION_STEPS, settings.explain_steps))
        paces = []
        for _ in range(CALIBRATION_RUNS):
            run = Budget(math.inf)
            explain(loaded, CALIBRATION_TEXT, options, settings, run)
            paces += [] if run.per_token_step is None else [run.per_token_step]
        self.per_token_step = min(paces, default=None)


def explain_all(
    loaded: LoadedModel,
    items: Sequence[tuple[TextInput, ExplainOptions]],
    settings: HandlerSettings,
    budget: Budget | None = None,
) -> list[Explanation | Rejected]:
    """Each text explained alone, in order, within one ``budget``; a model failure is its 500.
    Before a worker's first explanation its budget is timed (``Budget.calibrate``), out of the
    batch's share: a worker never asked for an explanation spends nothing on them at its start.
    A pace that refused a text is timed again before the next batch, so that a slow spell
    refuses texts only while it lasts, not until a shorter text is explained."""
    left = None
    if budget is not None:
        started = time.perf_counter()
        if budget.per_token_step is None:
            try:
                budget.calibrate(loaded, settings)
            except Exception:  # the texts' own explanations answer the failure, each its 500
                logger.exception("timing an explanation for the budget failed")
        left = Budget(budget.seconds - (time.perf_counter() - started), budget.per_token_step)
    outcomes: list[Explanation | Rejected] = []
    for text, options in items:
        started = time.perf_counter()
        try:
            outcome = explain(loaded, text, options, settings, left)
        except Exception:
            logger.exception("explaining a text failed")
            outcome = Rejected(
                ErrorCode.INTERNAL_ERROR, "the model failed to explain this text; retry later"
            )
        outcomes.append(outcome)
        if left is not None:
            left.seconds -= time.perf_counter() - started
            if budget is not None and isinstance(outcome, Explanation):
                budget.per_token_step = left.per_token_step
    if budget is not None and left is not None and left.refused:
        budget.per_token_step = None
    return outcomes


def explain(
    loaded: LoadedModel,
    text: TextInput,
    options: ExplainOptions,
    settings: HandlerSettings,
    budget: Budget | None = None,
) -> Explanation | Rejected:
    """One text's explanation, or why it has none; may raise if the model fails. A text over
    the ``budget`` is refused; an explained one's time is recorded in it."""
    # Captum (and the matplotlib it imports) loads at a worker's first explanation, before
    # its timing, rather than at every worker's start.
    from captum.attr import LayerIntegratedGradients

    steps = settings.explain_steps if options.n_steps is None else options.n_steps
    if steps > settings.explain_steps:
        return Rejected(
            ErrorCode.INVALID_OPTION,
            f'"n_steps" is {steps}; this server explains with at most {settings.explain_steps} '
            "(explain_steps)",
        )
    (tokenized,) = tokenize(loaded.tokenizer, [text], settings.max_length)
    tokens = len(tokenized.input_ids)
    if tokens > settings.explain_max_tokens:
        return Rejected(
            ErrorCode.EXPLAIN_TOO_LONG,
            f"the text has {tokens} tokens; explanations take at most "
            f"{settings.explain_max_tokens} (explain_max_tokens): shorten it, or ask "
            "/predictions for its label",
        )
    if budget is not None and budget.estimate(tokens, steps) > budget.seconds:
        budget.refused = True
        return Rejected(
            ErrorCode.EXPLAIN_TOO_LONG,
            f"explaining this text ({tokens} tokens, {steps} steps) would take about "
            f"{budget.estimate(tokens, steps):.1f} s on this worker, over the "
            f"{max(budget.seconds, 0.0):.1f} s its batch has left for explanations (half of "
            "responseTimeout): send it alone, with fewer n_steps, or shorter",
        )
    started = time.perf_counter()
    input_ids, attention_mask, token_type_ids = model_inputs(loaded, [tokenized])
    baseline = torch.tensor([baseline_ids(tokenized, loaded.tokenizer.pad_token_id)])
    device = loaded.device
    extra = tuple(t.to(device) for t in (attention_mask, token_type_ids) if t is not None)
    input_ids, baseline = input_ids.to(device), baseline.to(device)
    with torch.no_grad():
        logits = _forward(loaded.model, input_ids, *extra).cpu()
    scores = apply_score_function(loaded.score_function, logits)[0].tolist()
    best = max(range(len(scores)), key=lambda i: scores[i])
    target = target_index(options.target, loaded.labels, best)
    if isinstance(target, Rejected):
        return target
    layer = LayerIntegratedGradients(
        lambda ids, *rest: _forward(loaded.model, ids, *rest), loaded.model.get_input_embeddings()
    )
    with torch.enable_grad():
        attributions, delta = layer.attribute(
            inputs=input_ids,
            baselines=baseline,
            target=target,
            additional_forward_args=extra,
            n_steps=steps,
            internal_batch_size=internal_batch_size(settings, loaded.max_batch_tokens, tokens),
            return_convergence_delta=True,
        )
    if budget is not None:
        budget.record(tokens, steps, time.perf_counter() - started)
    explanation = Explanation(
        words=loaded.tokenizer.convert_ids_to_tokens(tokenized.input_ids),
        importances=summarize(attributions),
        delta=float(delta.reshape(-1)[0]),
        label=loaded.labels[target],
        score=float(scores[target]),
        truncated=tokenized.truncated,
        n_steps=steps,
    )
    return explanation if is_finite(explanation) else not_finite(loaded.dtype)


def is_finite(explanation: Explanation) -> bool:
    """JSON has no NaN or infinity: ``json.dumps`` would write them, and no client could read it."""
    numbers = [*explanation.importances, explanation.delta, explanation.score]
    return all(math.isfinite(value) for value in numbers)


def not_finite(weights: torch.dtype) -> Rejected:
    return Rejected(
        ErrorCode.INTERNAL_ERROR,
        f"this text's explanation came out as NaN or infinity (the model runs in "
        f"{str(weights).removeprefix('torch.')}), which JSON cannot carry: ask /predictions "
        "for its label, or a server in fp32 for its explanation",
    )


def summarize(attributions: torch.Tensor) -> list[float]:
    """Summed over the hidden size, then L2-normalised (all zeros stay zeros), as floats."""
    summed = attributions.detach().float().sum(dim=-1).squeeze(0)
    norm = float(torch.linalg.vector_norm(summed))
    values = (summed / norm if norm > 0 and math.isfinite(norm) else summed).tolist()
    return [float(value) for value in values]


def _forward(model: Any, input_ids: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
    """Logits, with the attention mask and token types when the model takes them."""
    inputs = {"input_ids": input_ids, "attention_mask": extra[0]}
    if len(extra) > 1:
        inputs["token_type_ids"] = extra[1]
    logits: torch.Tensor = model(**inputs).logits
    return logits.float()
