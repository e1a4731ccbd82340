"""Can this Hugging Face folder be served? One check, run by ``make package`` and at worker start
(the rules and why: docs/own-model.md). ``inspect_folder`` never reads the weights, so a folder is
refused in seconds with every reason the worker would give after minutes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handler.settings import HandlerSettings

POSITIONS_AFTER_PAD = {
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "roberta-prelayernorm",
    "data2vec-text",
    "mpnet",
}
"""Model types whose position ids start after the pad id (``padding_idx + 1``)."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "spm.model",
    "tokenizer.model",
)
"""Files a tokenizer is read from; without any, transformers 5 builds an empty one silently."""

PADDING_TOLERANCE = 1e-3
"""Largest logit change allowed between a row alone and the same row padded (fp32)."""


@dataclass(frozen=True)
class Problem:
    """One reason a folder cannot be served, and what to do about it."""

    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.reason} (fix: {self.fix})"


@dataclass(frozen=True)
class Attention:
    implementation: str
    """What ``from_pretrained`` gets: ``sdpa`` or ``eager``."""
    reason: str


@dataclass(frozen=True)
class Inspection:
    """What the check read: reused by the worker so nothing is loaded twice."""

    problems: list[Problem]
    tokenizer: Any = None
    attention: Attention | None = None


class ModelRefused(ValueError):
    """The folder breaks the rules; the message lists every problem on one line."""

    def __init__(self, model_dir: Path, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(f"{model_dir} cannot be served: " + "; ".join(map(str, problems)))


def inspect_folder(model_dir: Path, settings: HandlerSettings) -> Inspection:
    """Every problem of ``model_dir`` for these settings; an empty list means servable."""
    problems = file_problems(model_dir)
    if not (model_dir / "config.json").is_file():
        return Inspection(problems)
    config, model_class, config_problems = read_config(model_dir)
    problems += config_problems
    tokenizer, tokenizer_problems = read_tokenizer(model_dir)
    problems += tokenizer_problems
    attention = None
    if config is not None:
        problems += length_problems(config, settings.max_length)
        if tokenizer is not None:
            problems += vocabulary_problems(config, tokenizer) + pad_problems(config, tokenizer)
    if model_class is not None:
        chosen = choose_attention(model_class, settings.attention)
        if isinstance(chosen, Problem):
            problems.append(chosen)
        else:
            attention = chosen
    return Inspection(problems, tokenizer, attention)


def file_problems(model_dir: Path) -> list[Problem]:
    if not model_dir.is_dir():
        return [Problem(f"{model_dir} is not a folder", "give a Hugging Face model folder")]
    problems = []
    if not (model_dir / "config.json").is_file():
        problems.append(
            Problem("no config.json", "give the folder `save_pretrained` wrote for the model")
        )
    if not list(model_dir.glob("*.safetensors")):
        pickled = sorted(p.name for p in model_dir.glob("*") if p.suffix in {".bin", ".pt", ".pth"})
        only = f" (only pickled {', '.join(pickled)}, which is never loaded)" if pickled else ""
        problems.append(
            Problem(
                "no *.safetensors weights" + only,
                "convert once: AutoModelForSequenceClassification.from_pretrained(DIR)"
                ".save_pretrained(DIR, safe_serialization=True)",
            )
        )
    return problems


def read_config(model_dir: Path) -> tuple[Any, Any, list[Problem]]:
    """The model config and its sequence-classification class, or the problems found."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    raw = json.loads((model_dir / "config.json").read_text())
    architectures = raw.get("architectures") or []
    problems = []
    if not any(str(name).endswith("ForSequenceClassification") for name in architectures):
        problems.append(
            Problem(
                f"config.json architectures {architectures} is not a sequence classifier",
                "fine-tune or save the model as its *ForSequenceClassification class",
            )
        )
    if not raw.get("id2label"):
        problems.append(Problem("config.json has no id2label", "add the label names by index"))
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except (ValueError, KeyError, OSError) as error:
        problems.append(
            Problem(f"config.json does not load: {error}", "use a model type this transformers has")
        )
        return None, None, problems
    try:
        model_class = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]
    except KeyError:
        problems.append(
            Problem(
                f"transformers has no sequence classifier for model_type {config.model_type!r}",
                "use a BERT-family encoder with a *ForSequenceClassification class",
            )
        )
        return config, None, problems
    return config, model_class, problems


def read_tokenizer(model_dir: Path) -> tuple[Any, list[Problem]]:
    from transformers import AutoTokenizer

    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        return None, [
            Problem(
                f"no tokenizer files (none of {', '.join(TOKENIZER_FILES)})",
                "save the model's tokenizer into the folder: tokenizer.save_pretrained(DIR)",
            )
        ]
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (ValueError, OSError, TypeError, AttributeError, ImportError) as error:
        return None, [
            Problem(
                f"the tokenizer does not load: {error}",
                "save the model's tokenizer into the folder (tokenizer.save_pretrained(DIR))",
            )
        ]
    if not tokenizer.is_fast:
        return None, [
            Problem(
                f"no fast tokenizer ({type(tokenizer).__name__} is a slow one)",
                "save a fast one: AutoTokenizer.from_pretrained(DIR, use_fast=True)"
                ".save_pretrained(DIR) writes tokenizer.json",
            )
        ]
    return tokenizer, []


def usable_positions(config: Any) -> int | None:
    """Tokens one row may hold, from the model's position table; None when it has none."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    if config.model_type in POSITIONS_AFTER_PAD:
        return int(positions) - int(config.pad_token_id or 0) - 1
    return int(positions)


def length_problems(config: Any, max_length: int) -> list[Problem]:
    positions = usable_positions(config)
    if positions is None or max_length <= positions:
        return []
    return [
        Problem(
            f"max_length {max_length} exceeds the model's {positions} positions",
            f"set max_length to at most {positions} in the handler config",
        )
    ]


def vocabulary_problems(config: Any, tokenizer: Any) -> list[Problem]:
    embeddings = getattr(config, "vocab_size", None)
    if embeddings is None or len(tokenizer) <= embeddings:
        return []
    return [
        Problem(
            f"the tokenizer has {len(tokenizer)} tokens but the model embeds only {embeddings}",
            "save the tokenizer the model was trained with",
        )
    ]


def pad_problems(config: Any, tokenizer: Any) -> list[Problem]:
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        return [
            Problem(
                "the tokenizer has no pad token, so texts of different lengths cannot share a batch",
                "set the model's pad token: tokenizer.pad_token = ...; tokenizer.save_pretrained(DIR)",
            )
        ]
    model_pad = getattr(config, "pad_token_id", None)
    if model_pad is not None and model_pad != pad_id:
        return [
            Problem(
                f"the tokenizer pads with id {pad_id} ({tokenizer.pad_token!r}) but config.json's "
                f"pad_token_id is {model_pad}: the model reads padding (RoBERTa-style models also "
                "positions) from its own id, so this tokenizer is not the model's",
                "save the tokenizer the model was trained with, or make the two pad ids agree",
            )
        ]
    return []


def choose_attention(model_class: Any, setting: str) -> Attention | Problem:
    """``auto``: sdpa where the class has it, else its own; ``sdpa``/``eager``: as set."""
    import transformers

    name = model_class.__name__
    has_sdpa = bool(getattr(model_class, "_supports_sdpa", False))
    missing = f"{name} has no sdpa attention in transformers {transformers.__version__}"
    if setting == "auto":
        if has_sdpa:
            return Attention("sdpa", f"{name} supports it")
        return Attention("eager", missing)
    if setting == "sdpa" and not has_sdpa:
        return Problem(
            f"attention is set to sdpa but {missing}",
            "set attention: auto (or eager) in the handler config",
        )
    return Attention(setting, "set in the handler config")


def padding_difference(model: Any, tokenizer: Any, device: torch.device) -> float:
    """The largest logit change of a short text between alone and padded on the right beside a
    long one, as the handler pads (the tokenizer's pad id, attention mask 0)."""
    short, long = (
        tokenizer(text)["input_ids"]
        for text in ("A short one.", "A much longer text that needs padding " * 3)
    )
    rows = torch.full((2, len(long)), tokenizer.pad_token_id, dtype=torch.long)
    rows[0, : len(short)] = torch.tensor(short)
    rows[1] = torch.tensor(long)
    mask = (torch.arange(len(long)) < torch.tensor([[len(short)], [len(long)]])).long()
    with torch.inference_mode():
        alone = model(input_ids=torch.tensor([short], device=device)).logits.float()
        padded = model(input_ids=rows.to(device), attention_mask=mask.to(device)).logits.float()
    return float((alone[0] - padded[0]).abs().max())
