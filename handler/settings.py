"""Handler settings: one frozen object, built once at worker start from the ``handler:``
section of ``config/model-config.yaml`` (TorchServe hands it to the worker as
``context.model_yaml_config["handler"]``). Batch size, delay and workers are TorchServe's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

THREADS_ENV = "OMP_NUM_THREADS"
"""Where the project's start puts the torch threads it sized per worker (torch reads it)."""
SCORE_FUNCTION_CHOICES = ("auto", "softmax", "sigmoid", "none")
PRECISION_CHOICES = ("auto", "fp32", "bf16", "fp16", "tf32")
CHOICES = {
    "device": ("auto", "cpu", "cuda"),
    "attention": ("auto", "sdpa", "eager"),
    "precision": PRECISION_CHOICES,
    "score_function": SCORE_FUNCTION_CHOICES,
    "capture": ("eager", "compile", "cuda_graphs"),
    "long_texts": ("windows", "truncate"),
    "window_multi_label": ("mean", "max"),
}


@dataclass(frozen=True)
class HandlerSettings:
    """Limits and choices, each explained in config/model-config.yaml; all have safe defaults."""

    max_length: int = 128
    max_chars: int = 10_000
    max_texts_per_request: int = 64
    max_batch_tokens: int = 0
    """0: measured on the device at worker start (``handler.model.measured_budget``)."""
    device: str = "auto"
    torch_threads: int = 0
    """0: as the project's start sized them (``OMP_NUM_THREADS``), else one (``worker_threads``)."""
    labels: tuple[str, ...] = ()
    """Empty: ``id2label`` of the model config."""
    attention: str = "auto"
    """``auto``: ``sdpa`` where the architecture has it, else ``eager`` (``model_check``)."""
    precision: str = "auto"
    """``auto``: the start's choice (``handler.precision``); ``fp32`` pins IEEE fp32."""
    pin_memory: bool = True
    score_function: str = "auto"
    multi_label_threshold: float = 0.5
    explain_steps: int = 50
    """The default and the most a request may ask for (``n_steps``)."""
    explain_max_tokens: int = 128
    explain_internal_batch_size: int = 0
    """0: as many steps as ``max_batch_tokens`` holds for the text's length (at least 1)."""
    capture: str = "eager"
    """The forward captured for bucketed shapes (``handler.capture``): eager (none), compile, cuda_graphs."""
    capture_rows: int = 4
    """The most texts of a sub-batch that runs captured (rows buckets 1, 2, 4, ... up to it)."""
    long_texts: str = "windows"
    """A text over ``max_length`` tokens: ``windows`` (classified whole, as overlapping windows
    combined: docs/api.md, Long texts) or ``truncate`` (its first ``max_length`` tokens)."""
    window_stride: int = -1
    """Tokens each window repeats of the one before (transformers' ``stride``); -1: a quarter
    of ``max_length`` (``stride``)."""
    window_multi_label: str = "mean"
    """A multi-label model's windows combined per label by their token-weighted mean, or max."""
    max_windows_per_request: int = 0
    """The most rows (windows, a short text is one) a request may bring; a request past it
    answers 413. 0: the windows of one text of ``max_chars`` one-character tokens, or
    ``max_texts_per_request`` if more (``windows_per_request``)."""
    stride: int = field(init=False, default=0)
    """Resolved at start: ``window_stride``, or where -1 a quarter of ``max_length``."""
    windows_per_request: int = field(init=False, default=0)
    """Resolved at start: ``max_windows_per_request``, or where 0 the windows of a text of
    ``max_chars`` tokens (one a character, the most most tokenizers make of plain text) with a
    single text's 2 special tokens, at least ``max_texts_per_request``."""

    def __post_init__(self) -> None:
        _require(self.max_length >= 8, f"max_length must be at least 8, got {self.max_length}")
        _require(self.max_chars >= 1, f"max_chars must be at least 1, got {self.max_chars}")
        _require(
            self.max_texts_per_request >= 1,
            f"max_texts_per_request must be at least 1, got {self.max_texts_per_request}",
        )
        _require(
            self.max_batch_tokens == 0 or self.max_batch_tokens >= self.max_length,
            f"max_batch_tokens ({self.max_batch_tokens}) must be 0 (measured) or at least "
            f"max_length ({self.max_length}), or a long text could never run",
        )
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            _require(value in choices, f"{name} must be one of {choices}, got {value!r}")
        _require(
            -1 <= self.window_stride <= (self.max_length - 4) // 2,
            f"window_stride must be -1 (a quarter of max_length) or between 0 and half of "
            f"max_length - 4 ({(self.max_length - 4) // 2}), got {self.window_stride}",
        )
        _require(
            self.max_windows_per_request >= 0,
            f"max_windows_per_request must be >= 0, got {self.max_windows_per_request}",
        )
        _require(self.capture_rows >= 1, f"capture_rows must be >= 1, got {self.capture_rows}")
        _require(self.torch_threads >= 0, f"torch_threads must be >= 0, got {self.torch_threads}")
        _require(
            len(set(self.labels)) == len(self.labels),
            f"labels must be unique, got {list(self.labels)}",
        )
        _require(
            0.0 <= self.multi_label_threshold <= 1.0,
            f"multi_label_threshold must be between 0 and 1, got {self.multi_label_threshold}",
        )
        _require(self.explain_steps >= 1, f"explain_steps must be >= 1, got {self.explain_steps}")
        _require(
            self.explain_max_tokens >= 3,
            f"explain_max_tokens must be at least 3, got {self.explain_max_tokens}",
        )
        _require(
            self.explain_internal_batch_size >= 0,
            "explain_internal_batch_size must be >= 0 (0: from max_batch_tokens), "
            f"got {self.explain_internal_batch_size}",
        )
        stride = self.max_length // 4 if self.window_stride < 0 else self.window_stride
        room = self.max_length - 2
        windows = 1 + max(0, -(-(self.max_chars - room) // (room - stride)))
        per_request = self.max_windows_per_request or max(windows, self.max_texts_per_request)
        object.__setattr__(self, "stride", stride)  # derived once, read on every request
        object.__setattr__(self, "windows_per_request", per_request)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> HandlerSettings:
        """Build settings from the yaml section, rejecting unknown keys and wrong types."""
        raw = dict(raw or {})
        known = {item.name: item for item in fields(cls) if item.init}
        unknown = sorted(set(raw) - set(known))
        _require(not unknown, f"unknown handler settings {unknown}; known: {sorted(known)}")
        values = {name: _checked(name, getattr(cls, name), value) for name, value in raw.items()}
        return cls(**values)


def worker_threads(torch_threads: int, environ: Mapping[str, str]) -> int:
    """The torch threads a worker sets, 0 for none (torch's own are kept): ``torch_threads``
    where the model config states them; none where ``OMP_NUM_THREADS`` is set (the project's
    start sized the threads to its workers, and torch has read them); else, on a plain
    ``torchserve --start``, one. TorchServe then starts its default of one worker per CPU
    (per GPU on a GPU host) and tells a worker nothing of the others, so one thread is the
    share that never runs more threads than there are CPUs; torch's own default, every CPU in
    each worker, ran CPUs x CPUs."""
    if torch_threads or environ.get(THREADS_ENV, "").strip():
        return torch_threads
    return 1


def _checked(name: str, default: Any, value: Any) -> Any:
    """The yaml value if it has the type of the field's default (bool is not an int here)."""
    if isinstance(default, tuple):
        _require(
            isinstance(value, list | tuple) and all(isinstance(v, str) for v in value),
            f"{name} must be a list of strings, got {value!r}",
        )
        return tuple(value)
    if isinstance(default, bool):
        _require(isinstance(value, bool), f"{name} must be true or false, got {value!r}")
    elif isinstance(default, float):
        _require(
            isinstance(value, int | float) and not isinstance(value, bool),
            f"{name} must be a number, got {value!r}",
        )
        return float(value)
    elif isinstance(default, int):
        _require(
            isinstance(value, int) and not isinstance(value, bool),
            f"{name} must be an integer, got {value!r}",
        )
    else:
        _require(isinstance(value, str), f"{name} must be a string, got {value!r}")
    return value


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
