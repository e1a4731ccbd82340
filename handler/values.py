"""The handler's values, torch-free: what a request carries, what a text gets back, what a
batch cost. Every stage passes these; none of them computes anything."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from handler.errors import ErrorCode

TextInput = str | tuple[str, str]
"""One item to classify: a text, or a (text, text_pair) pair tokenized as one input."""


@dataclass(frozen=True)
class TokenizedText:
    input_ids: list[int]
    truncated: bool
    token_type_ids: list[int] | None = None
    special_tokens_mask: list[int] | None = None
    """1 for the tokens the tokenizer added ([CLS], [SEP], ...), 0 for the text's own."""


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    scores: dict[str, float]
    truncated: bool
    labels: list[str] | None = None
    """Multi-label models only: every label scoring at least the threshold, best first."""
    raw_scores: dict[str, float] | None = None
    """The logits, kept until the request's options are applied; never answered as such."""
    windows: int | None = None
    """The windows a long text was classified as (``combine``); None for one."""


@dataclass(frozen=True)
class Explanation:
    """Which tokens made a label (``handler.explain``; the fields: docs/api.md, Explanations)."""

    words: list[str]
    importances: list[float]
    delta: float
    label: str
    score: float
    truncated: bool
    n_steps: int


@dataclass
class BatchStats:
    """What one batch cost; logged per batch and used by the metrics."""

    texts: int = 0
    sub_batches: list[int] = field(default_factory=list)
    real_tokens: int = 0
    padded_tokens: int = 0
    tokenize_ms: float = 0.0
    forward_ms: float = 0.0
    threads: int = 0
    """The torch threads its forward passes ran with."""
    forward_started: list[float] = field(default_factory=list)
    """Each sub-batch's forward start, ``time.perf_counter()`` seconds."""
    sub_batch_forward_ms: list[float] = field(default_factory=list)
    sub_batch_of: list[tuple[int, ...]] = field(default_factory=list)
    """For each text, in the order given, the sub-batches its windows were forwarded in."""
    handler_ms: float = 0.0
    """From the handler's receipt of the batch to its outcomes (set by the pipeline)."""
    explained: int = 0
    """Texts explained (each alone, after the forward passes) and the time it took."""
    explain_ms: float = 0.0
    text_tokens: list[int] = field(default_factory=list)
    """Each text's tokens, in the order given (the reference profile's input length); a
    windowed text's, its windows' together."""
    windows: list[int] = field(default_factory=list)
    """Each forwarded text's windows (1 for a text in one), in the order given."""


@dataclass(frozen=True)
class ScoreOptions:
    """Per-request choices, applied after the forward pass, so they never change batching."""

    top_k: int | None = None
    """Keep only the k best labels in ``scores``, best first (None: every label, in order)."""
    raw_scores: bool = False
    """Answer the logits instead of the model's score function applied to them."""


@dataclass(frozen=True)
class ExplainOptions:
    """An explanation request's choices; on a text, they make it an explanation."""

    target: str | int | None = None
    """The label to explain, by name or class index; None: the predicted label."""
    n_steps: int | None = None
    """Integrated-gradients steps, at most the ``explain_steps`` setting; None: that setting."""


@dataclass(frozen=True)
class ValidText:
    """A text ready to classify, with its optional second text and its request's options;
    ``explain`` is set when the request asked for an explanation instead of a prediction."""

    text: str
    text_pair: str | None = None
    options: ScoreOptions = ScoreOptions()
    explain: ExplainOptions | None = None
    windows: bool | None = None
    """The request's ``"windows"``: classify a long text as windows, or on its first
    ``max_length`` tokens; None: as the ``long_texts`` setting says."""

    @property
    def items(self) -> tuple[ValidText]:
        """A request of one text is its one item."""
        return (self,)


@dataclass(frozen=True)
class Rejected:
    """A text, or a whole request, refused: the error code (``handler.errors``) and why."""

    code: ErrorCode
    message: str


ItemOutcome = Prediction | Explanation | Rejected


class Texts(Protocol):
    """A decoded request: its texts in order, each valid or refused on its own."""

    @property
    def items(self) -> tuple[ValidText | Rejected, ...]: ...


@dataclass(frozen=True)
class IncomingRequest:
    """One request as TorchServe delivered it, reduced to what the handler reads."""

    fields: dict[str, Any]
    content_type: str | None
    request_id: str
    headers: Mapping[str, Any] = field(default_factory=dict)
    model_name: str = ""


@dataclass(frozen=True)
class Response:
    status: int
    phrase: str
    body: str


@dataclass(frozen=True)
class ListOutcome:
    """One decoded request's outcomes: a prediction or error per text, in order."""

    request: Texts
    items: tuple[ItemOutcome, ...]


Outcome = ListOutcome | Rejected
