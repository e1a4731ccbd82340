"""Explanations: which tokens made a label, one text at a time.

The importances are those of TorchServe's stock Transformer handler, so its users can compare:
Captum's ``LayerIntegratedGradients`` of the explained label's logit with respect to the output
of the model's input embeddings layer (``model.get_input_embeddings()``, whatever the
architecture names it), from a baseline of the same tokens with every token of the text replaced
by the pad token (the special tokens stay), summed over the hidden size and L2-normalised.

Each text is explained on its own (its steps batched ``internal_batch_size`` at a time), so an
explanation does not depend on its batch-mates. A text's outcome is data: an ``Explanation``,
or ``Rejected`` (a label the model does not have, steps over the cap, a text over
``explain_max_tokens``); it never raises for bad input.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from captum.attr import LayerIntegratedGradients

from handler.errors import ErrorCode
from handler.inference import Explanation, TextInput, TokenizedText, model_inputs, tokenize
from handler.model import LoadedModel
from handler.protocol import Rejected
from handler.scoring import ExplainOptions, apply_score_function
from handler.settings import HandlerSettings


def baseline_ids(tokenized: TokenizedText, pad_id: int) -> list[int]:
    """The same tokens, each of the text's own (not special) replaced by the pad token."""
    mask = tokenized.special_tokens_mask or [0] * len(tokenized.input_ids)
    return [
        token if special else pad_id
        for token, special in zip(tokenized.input_ids, mask, strict=True)
    ]


def internal_batch_size(settings: HandlerSettings, tokens: int) -> int:
    """Steps per forward and backward pass: the setting, or as many rows of this text as
    ``max_batch_tokens`` holds (the predictions' budget per pass), at least one."""
    if settings.explain_internal_batch_size:
        return settings.explain_internal_batch_size
    return max(1, settings.max_batch_tokens // tokens)


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


def explain(
    loaded: LoadedModel, text: TextInput, options: ExplainOptions, settings: HandlerSettings
) -> Explanation | Rejected:
    """One text's explanation, or why it has none; may raise if the model fails."""
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
            internal_batch_size=internal_batch_size(settings, tokens),
            return_convergence_delta=True,
        )
    return Explanation(
        words=loaded.tokenizer.convert_ids_to_tokens(tokenized.input_ids),
        importances=summarize(attributions),
        delta=float(delta.reshape(-1)[0]),
        label=loaded.labels[target],
        score=float(scores[target]),
        truncated=tokenized.truncated,
        n_steps=steps,
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
