"""From logits to scores: the function a model's head needs, as transformers' text-classification
pipeline picks it (the reference the answers are tested against), and the per-request options."""

from __future__ import annotations

from enum import StrEnum

import torch


class ScoreFunction(StrEnum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"
    NONE = "none"


AUTO = "auto"
PROBLEM_TYPES = ("regression", "multi_label_classification", "single_label_classification")


def pipeline_function(problem_type: str | None, num_labels: int) -> ScoreFunction:
    """What transformers' text-classification pipeline applies to this model's logits."""
    if problem_type == "regression":
        return ScoreFunction.NONE
    if problem_type == "multi_label_classification" or num_labels == 1:
        return ScoreFunction.SIGMOID
    return ScoreFunction.SOFTMAX


def resolve_score_function(
    problem_type: str | None, num_labels: int, setting: str
) -> tuple[ScoreFunction, str]:
    """The function to apply and where it came from (for the start-up log line)."""
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise ValueError(
            f"the model config's problem_type {problem_type!r} is unknown; "
            f"expected one of {PROBLEM_TYPES}"
        )
    from_config = pipeline_function(problem_type, num_labels)
    described = f"problem_type={problem_type}, num_labels={num_labels}"
    if setting == AUTO:
        return from_config, f"from the model config ({described})"
    chosen = ScoreFunction(setting)
    if problem_type is not None and chosen != from_config:
        raise ValueError(
            f"score_function {setting!r} contradicts the model config ({described} means "
            f"{from_config.value}); set score_function: auto, or fix problem_type in config.json"
        )
    return chosen, f"from the handler setting score_function ({described})"


def apply_score_function(function: ScoreFunction, logits: torch.Tensor) -> torch.Tensor:
    """Scores per row from float32 logits (softmax is numerically stable in torch)."""
    if function is ScoreFunction.SOFTMAX:
        return torch.softmax(logits, dim=-1)
    if function is ScoreFunction.SIGMOID:
        return torch.sigmoid(logits)
    return logits
