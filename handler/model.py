"""Loading the classifier once per worker, after ``handler.model_check`` found it servable,
and the function from its logits to scores: the one transformers' text-classification pipeline
picks for its head (the reference the answers are tested against)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification

from handler.capture import Buckets, Captured, build_capture
from handler.model_check import (
    PADDING_TOLERANCE,
    Attention,
    ModelRefused,
    Problem,
    inspect_folder,
    padding_difference,
)
from handler.precision import (
    AUTO as AUTO_PRECISION,
)
from handler.precision import (
    CHOSEN_ENV,
    DTYPES,
    check_precision,
    choose_attention_kernels,
    chosen_for,
    hardware_of,
    set_matmul_precision,
)
from handler.settings import HandlerSettings

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    labels: tuple[str, ...]
    device: torch.device
    dtype: torch.dtype = torch.float32
    """The weights' precision (cast at load: faster than autocast, docs/bench/README.md)."""
    pin_memory: bool = False
    score_function: ScoreFunction = ScoreFunction.SOFTMAX
    multi_label_threshold: float | None = None
    """Set for multi-label models (sigmoid over several labels): answers carry ``labels``."""
    uses_token_types: bool = False
    """The tokenizer's model inputs include token type ids (BERT yes; RoBERTa, DistilBERT no)."""
    max_batch_tokens: int = 0
    """Padded tokens per forward pass: the setting, or measured at load (``measured_budget``)."""
    captured: Captured | None = None
    """The forward captured for bucketed shapes (``handler.capture``), where ``capture`` is on."""


def select_device(preference: str, gpu_id: int | None) -> torch.device:
    """The GPU TorchServe assigned to this worker when there is one, else the CPU."""
    if preference == "cpu":
        return torch.device("cpu")
    if gpu_id is None or not torch.cuda.is_available():
        if preference == "cuda":
            raise ValueError(
                "device is 'cuda' but TorchServe assigned no GPU or CUDA is unavailable"
            )
        return torch.device("cpu")
    return torch.device("cuda", gpu_id)


def label_names(
    id2label: dict[int, str], num_labels: int, override: tuple[str, ...]
) -> tuple[str, ...]:
    """Labels by class index, from the settings when given, else from the model config."""
    labels = override or tuple(id2label[index] for index in range(num_labels))
    if len(labels) != num_labels:
        raise ValueError(f"{len(labels)} labels configured but the model has {num_labels} classes")
    return labels


def settled_precision(
    settings: HandlerSettings, key: str, environ: Mapping[str, str]
) -> tuple[HandlerSettings, str]:
    """``settings`` with ``auto`` replaced by the start's choice for the model ``key``
    (``NAME:VERSION``), else by fp32; and what was settled, for the log."""
    if settings.precision != AUTO_PRECISION:
        return settings, f"precision {settings.precision}: stated"
    chosen = chosen_for(key, environ)
    if chosen is None:
        why = f"precision auto: fp32, as the project's start chose nothing for {key} ({CHOSEN_ENV})"
        return replace(settings, precision="fp32"), why
    return replace(settings, precision=chosen), f"precision auto: {chosen}, the start's choice"


def load_model(model_dir: Path, settings: HandlerSettings, gpu_id: int | None) -> LoadedModel:
    """The model in ``settings.precision``; ``auto`` is settled before (``settled_precision``),
    and loads in fp32 where it is not."""
    if settings.precision == AUTO_PRECISION:
        settings = replace(settings, precision="fp32")
    device = select_device(settings.device, gpu_id)
    check_precision(settings.precision, hardware_of(device))
    dtype = DTYPES[settings.precision]
    logger.info("%s", set_matmul_precision(settings.precision))
    choose_attention_kernels(device.type, dtype)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    inspection = inspect_folder(model_dir, settings)
    if inspection.problems or inspection.attention is None:
        raise ModelRefused(model_dir, inspection.problems)
    tokenizer, attention = inspection.tokenizer, inspection.attention
    logger.info("attention %s: %s", attention.implementation, attention.reason)
    model = load_classifier(model_dir, device, dtype, attention)
    if settings.precision == "fp32":
        moved = padding_difference(model, tokenizer, device)
        if moved > PADDING_TOLERANCE:
            problem = Problem(
                f"padding a text beside a longer one changes its logits by {moved:.3g}",
                "check the tokenizer's pad token and the attention setting",
            )
            raise ModelRefused(model_dir, [problem])
    labels = label_names(model.config.id2label, model.config.num_labels, settings.labels)
    function, source = resolve_score_function(
        getattr(model.config, "problem_type", None), len(labels), settings.score_function
    )
    multi_label = function is ScoreFunction.SIGMOID and len(labels) > 1
    logger.info(
        "loaded %s on %s in %s: labels=%s score_function=%s %s%s max_length=%d torch_threads=%d",
        model.config.model_type,
        device,
        settings.precision,
        list(labels),
        function.value,
        source,
        f" multi_label_threshold={settings.multi_label_threshold}" if multi_label else "",
        settings.max_length,
        torch.get_num_threads(),
    )
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        labels=labels,
        device=device,
        dtype=dtype,
        pin_memory=settings.pin_memory,
        score_function=function,
        multi_label_threshold=settings.multi_label_threshold if multi_label else None,
        uses_token_types="token_type_ids" in tokenizer.model_input_names,
        max_batch_tokens=settings.max_batch_tokens,
    )
    if not settings.max_batch_tokens:
        cap = settings.max_texts_per_request * settings.max_length
        budget, why = measured_budget(loaded, settings.max_length, cap)
        logger.info("%s", why)
        loaded = replace(loaded, max_batch_tokens=budget)
    buckets = Buckets.up_to(settings.capture_rows, settings.max_length)
    pad_id = tokenizer.pad_token_id
    captured = build_capture(
        settings.capture, model, device, buckets, pad_id, loaded.uses_token_types
    )
    return replace(loaded, captured=captured)


def load_classifier(
    model_dir: Path, device: torch.device, weights: torch.dtype, attention: Attention
) -> Any:
    """The model from safetensors only, on its device in eval mode."""
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir,
        local_files_only=True,
        use_safetensors=True,
        attn_implementation=attention.implementation,
    )
    return model.to(device=device, dtype=weights).eval()


def forward(
    loaded: LoadedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float32 logits on the CPU, one row per input: one move to the device (pinned, so
    asynchronous, on CUDA when enabled) and one back."""
    device = loaded.device
    on_cuda = device.type == "cuda"
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        inputs["token_type_ids"] = token_type_ids
    if on_cuda and loaded.pin_memory:
        inputs = {name: tensor.pin_memory() for name, tensor in inputs.items()}
    with torch.inference_mode():
        on_device = {name: t.to(device, non_blocking=on_cuda) for name, t in inputs.items()}
        captured = None if loaded.captured is None else loaded.captured(on_device)
        raw = loaded.model(**on_device).logits if captured is None else captured
        return to_host(raw.float())


def to_host(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` on the CPU. From a GPU the copy is queued and the worker sleeps on a blocking
    event until it lands (``cudaEventBlockingSync``), where a plain copy would spin a host core
    for the whole pass: a core the other workers' tokenizing and answering can use."""
    if logits.device.type != "cuda":
        return logits.cpu()
    host = logits.to("cpu", non_blocking=True)
    landed = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
    landed.record()
    landed.synchronize()
    return host


FIXED_SHARE = 0.1
"""``measured_budget``: a forward pass is large enough once its fixed cost is this share of it."""


def pass_cost(loaded: LoadedModel, max_length: int, repeats: int = 3) -> tuple[float, float]:
    """(fixed seconds, seconds per padded token) of a forward pass on this device, from the
    fastest of ``repeats`` passes of 8 tokens and of 2 rows of ``max_length``, after a warm-up."""
    pad = loaded.tokenizer.pad_token_id

    def seconds(rows: int, length: int) -> float:
        ids = torch.full((rows, length), pad, dtype=torch.long)
        mask = torch.ones_like(ids)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            forward(loaded, ids, mask)  # logits come back to the CPU: the device is done
            times.append(time.perf_counter() - started)
        return min(times[1:])

    small, large = 8, 2 * max_length
    small_s, large_s = seconds(1, small), seconds(2, max_length)
    per_token = (large_s - small_s) / (large - small)
    return small_s - per_token * small, per_token


def measured_budget(loaded: LoadedModel, max_length: int, cap: int) -> tuple[int, str]:
    """``max_batch_tokens`` for this model on this device, and why: the padded tokens at which
    a pass's fixed cost is ``FIXED_SHARE`` of it (a larger pass saves little more)."""
    fixed_s, per_token_s = pass_cost(loaded, max_length)
    if per_token_s <= 0:
        budget = cap
    else:
        budget = round(fixed_s / per_token_s * (1 - FIXED_SHARE) / FIXED_SHARE)
    budget = min(max(budget, max_length), cap)
    return budget, (
        f"max_batch_tokens {budget}: a pass costs {fixed_s * 1e3:.2f} ms + "
        f"{per_token_s * 1e6:.2f} us per padded token on {loaded.device}, so from about "
        f"{budget} tokens its fixed cost is under {FIXED_SHARE:.0%} of it "
        f"(between max_length {max_length} and {cap})"
    )


def head_kind(loaded: LoadedModel) -> str:
    """What kind of classifier it is, as its scores read."""
    if loaded.multi_label_threshold is not None:
        return "multi_label"
    if loaded.score_function is ScoreFunction.NONE:
        return "regression"
    if loaded.score_function is ScoreFunction.SIGMOID:
        return "one_logit"
    return "single_label"


def description(
    loaded: LoadedModel, settings: HandlerSettings, name: str, version: str
) -> dict[str, Any]:
    """The ``customizedMetadata`` of ``GET /models/{name}/{version}?customized=true``."""
    architectures = getattr(loaded.model.config, "architectures", None) or []
    return {
        "model": name,
        "version": version,
        "architecture": architectures[0] if architectures else loaded.model.config.model_type,
        "head": head_kind(loaded),
        "labels": list(loaded.labels),
        "score_function": loaded.score_function.value,
        "multi_label_threshold": loaded.multi_label_threshold,
        "max_length": settings.max_length,
        "max_batch_tokens": loaded.max_batch_tokens,
        "precision": settings.precision,
        "device": str(loaded.device),
    }
