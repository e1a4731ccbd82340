"""The handler's values, torch-free: what a request carries, what a text gets back, what a
batch cost. Every stage passes these; none of them computes anything.

The one table of per-item errors comes first: each ``ErrorCode`` with its HTTP status and
reason phrase (``HTTP_STATUS``).

    code               status  when
    empty_text         400     the text (or text_pair) is empty or only white space
    missing_field      400     a JSON object without a "text" field
    invalid_type       400     "text" / "text_pair" is not a string, or the body is not an object
    invalid_json       400     Content-Type is JSON but the body does not parse
    invalid_encoding   400     the body is not valid UTF-8
    invalid_option     400     an option has a value the API does not accept, or a field is
                               unknown (a typo such as "topk")
    payload_too_large  413     the text (or text_pair) has more characters than max_chars
    explain_too_long   413     an explanation of a text with more tokens than explain_max_tokens
    not_explainable    400     an explanation asked where there is none (Open Inference, v2)
    internal_error     500     the model failed on (or ran out of memory for) its batch
                               or gave a text's scores or explanation a NaN or infinity
    deadline_exceeded  504     its stated deadline passes before its batch can end (deadline.py)

Every error answers the same body shape, built by ``error_body``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class ErrorCode(StrEnum):
    EMPTY_TEXT = "empty_text"
    MISSING_FIELD = "missing_field"
    INVALID_TYPE = "invalid_type"
    INVALID_JSON = "invalid_json"
    INVALID_ENCODING = "invalid_encoding"
    INVALID_OPTION = "invalid_option"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    EXPLAIN_TOO_LONG = "explain_too_long"
    NOT_EXPLAINABLE = "not_explainable"
    INTERNAL_ERROR = "internal_error"
    DEADLINE_EXCEEDED = "deadline_exceeded"


HTTP_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.EMPTY_TEXT: (400, "Bad Request"),
    ErrorCode.MISSING_FIELD: (400, "Bad Request"),
    ErrorCode.INVALID_TYPE: (400, "Bad Request"),
    ErrorCode.INVALID_JSON: (400, "Bad Request"),
    ErrorCode.INVALID_ENCODING: (400, "Bad Request"),
    ErrorCode.INVALID_OPTION: (400, "Bad Request"),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, "Payload Too Large"),
    ErrorCode.EXPLAIN_TOO_LONG: (413, "Payload Too Large"),
    ErrorCode.NOT_EXPLAINABLE: (400, "Bad Request"),
    ErrorCode.INTERNAL_ERROR: (500, "Internal Server Error"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "Gateway Timeout"),
}


def error_body(code: ErrorCode, message: str, request_id: str) -> dict[str, Any]:
    return {"error": {"code": code.value, "message": message}, "request_id": request_id}


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
    """A text, or a whole request, refused: the error code (``ErrorCode``) and why."""

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
