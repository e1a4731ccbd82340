"""The batch as a whole: validate each item, classify the valid ones together, answer each.

``run_batch`` is what the TorchServe handler calls; it never raises. Each request gets
exactly one ``Response``, at its own index, whatever its batch-mates sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handler.decoding import (
    DEFAULT_MAX_TEXTS,
    LIST_ANSWER_KEYS,
    TEXTS_FIELD,
    Decoded,
    Rejected,
    TextList,
    ValidText,
    decode_request,
)
from handler.errors import HTTP_STATUS, ErrorCode, error_body
from handler.inference import BatchStats, Prediction, TextInput, with_options
from handler.open_inference import (
    InferRejected,
    InferRequest,
    decode_infer,
    render_infer,
    render_infer_error,
)

logger = logging.getLogger(__name__)

ItemOutcome = Prediction | Rejected


@dataclass(frozen=True)
class ListOutcome:
    """The answer to a list request: one prediction or error per text, in order."""

    items: tuple[ItemOutcome, ...]
    field: str = TEXTS_FIELD


@dataclass(frozen=True)
class InferOutcome(ListOutcome):
    """The answer to an Open Inference (KServe v2) request: its texts' outcomes and the request."""

    request: InferRequest = field(kw_only=True)


Outcome = ItemOutcome | ListOutcome
Slot = tuple[int, int | None]
Classifier = Callable[[Sequence[TextInput]], tuple[list[Prediction], BatchStats]]
BatchObserver = Callable[[Sequence[Outcome], BatchStats], None]


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


def safe_decode(
    request: IncomingRequest, max_chars: int, max_texts: int = DEFAULT_MAX_TEXTS
) -> Decoded:
    try:
        infer = decode_infer(
            request.fields,
            request.content_type,
            request.headers,
            request.model_name,
            max_chars,
            max_texts,
        )
        if infer is not None:
            return infer
        return decode_request(request.fields, request.content_type, max_chars, max_texts)
    except Exception:
        logger.exception("request %s: decoding raised; this is a bug", request.request_id)
        return Rejected(ErrorCode.INTERNAL_ERROR, "the request could not be decoded (server bug)")


def valid_slots(decoded: Sequence[Decoded]) -> list[tuple[Slot, TextInput]]:
    """Every valid text (or pair) of the batch with its place: (request index, index in its
    list or None)."""
    slots: list[tuple[Slot, TextInput]] = []
    for index, item in enumerate(decoded):
        if isinstance(item, ValidText):
            slots.append(((index, None), model_input(item)))
        elif isinstance(item, TextList):
            slots += [
                ((index, j), model_input(sub))
                for j, sub in enumerate(item.items)
                if isinstance(sub, ValidText)
            ]
    return slots


def model_input(valid: ValidText) -> TextInput:
    return valid.text if valid.text_pair is None else (valid.text, valid.text_pair)


def assemble(index: int, item: Decoded, results: dict[Slot, ItemOutcome]) -> Outcome:
    """Put the results back into the shape of the request they came from, each answered
    with its request's options."""
    if isinstance(item, Rejected):
        return item
    if isinstance(item, ValidText):
        return _answered(item, results.get((index, None)))
    items = tuple(
        sub if isinstance(sub, Rejected) else _answered(sub, results.get((index, j)))
        for j, sub in enumerate(item.items)
    )
    if isinstance(item, InferRequest):
        return InferOutcome(items, item.field, request=item)
    return ListOutcome(items, item.field)


def _answered(valid: ValidText, result: ItemOutcome | None) -> ItemOutcome:
    if result is None:
        return _placeholder()
    if isinstance(result, Rejected):
        return result
    return with_options(result, valid.options)


def classify_valid(
    decoded: Sequence[Decoded], classifier: Classifier
) -> tuple[list[Outcome], BatchStats]:
    """Run every valid text of the batch (single and list requests alike) in one call and put
    each result back at its own place."""
    slots = valid_slots(decoded)
    texts = [text for _, text in slots]
    results: dict[Slot, ItemOutcome] = {}
    stats = BatchStats()
    if texts:
        try:
            predictions, stats = classifier(texts)
            if len(predictions) != len(texts):
                raise AssertionError(
                    f"classifier returned {len(predictions)} predictions for {len(texts)} texts; this is a bug"
                )
            results = {
                slot: prediction for (slot, _), prediction in zip(slots, predictions, strict=True)
            }
        except Exception:
            logger.exception("classifying a batch of %d texts failed", len(texts))
            failure = Rejected(
                ErrorCode.INTERNAL_ERROR, "the model failed on this batch; retry later"
            )
            results = {slot: failure for slot, _ in slots}
            stats = BatchStats(texts=len(texts))
    return [assemble(index, item, results) for index, item in enumerate(decoded)], stats


def _placeholder() -> Rejected:
    return Rejected(ErrorCode.INTERNAL_ERROR, "no result was produced for this item (server bug)")


def render(outcome: Outcome, request_id: str) -> Response:
    """A rejected request answers its error status; a list request answers 200 with an entry
    per text (a prediction, or ``{"error": ...}`` for that text alone)."""
    if isinstance(outcome, InferRejected):
        return Response(*render_infer_error(outcome))
    if isinstance(outcome, InferOutcome):
        return Response(*render_infer(outcome.request, outcome.items, request_id))
    if isinstance(outcome, Rejected):
        status, phrase = HTTP_STATUS[outcome.code]
        body: dict[str, Any] = error_body(outcome.code, outcome.message, request_id)
    elif isinstance(outcome, ListOutcome):
        status, phrase = 200, "OK"
        entries = [_list_entry(item) for item in outcome.items]
        body = {LIST_ANSWER_KEYS[outcome.field]: entries, "request_id": request_id}
    else:
        status, phrase = 200, "OK"
        body = {**prediction_fields(outcome), "request_id": request_id}
    return Response(status=status, phrase=phrase, body=json.dumps(body))


def prediction_fields(prediction: Prediction) -> dict[str, Any]:
    """The answer's fields: label, score, scores, truncated, and labels for multi-label models."""
    fields: dict[str, Any] = {
        "label": prediction.label,
        "score": prediction.score,
        "scores": prediction.scores,
        "truncated": prediction.truncated,
    }
    if prediction.labels is not None:
        fields["labels"] = prediction.labels
    return fields


def _list_entry(item: ItemOutcome) -> dict[str, Any]:
    if isinstance(item, Rejected):
        return {"error": {"code": item.code.value, "message": item.message}}
    return prediction_fields(item)


def run_batch(
    requests: Sequence[IncomingRequest],
    classifier: Classifier,
    max_chars: int,
    observe: BatchObserver | None = None,
    max_texts: int = DEFAULT_MAX_TEXTS,
) -> list[Response]:
    """One response per request, in order; an unexpected failure answers 500 to this batch only.

    ``observe`` sees every batch's outcomes and stats (the metrics); it must not raise.
    """
    try:
        decoded = [safe_decode(request, max_chars, max_texts) for request in requests]
        outcomes, stats = classify_valid(decoded, classifier)
    except Exception:
        logger.exception("batch of %d failed unexpectedly; this is a bug", len(requests))
        outcomes = [Rejected(ErrorCode.INTERNAL_ERROR, "the batch failed (server bug)")] * len(
            requests
        )
        stats = BatchStats()
    _log_batch(requests, outcomes, stats)
    if observe is not None:
        observe(outcomes, stats)
    return [
        render(outcome, request.request_id)
        for outcome, request in zip(outcomes, requests, strict=True)
    ]


def _log_batch(
    requests: Sequence[IncomingRequest], outcomes: Sequence[Outcome], stats: BatchStats
) -> None:
    rejected = [
        (r.request_id, o.code.value)
        for r, o in zip(requests, outcomes, strict=True)
        if isinstance(o, Rejected)
    ]
    logger.info(
        "batch_size=%d valid=%d rejected=%d sub_batches=%s real_tokens=%d padded_tokens=%d "
        "tokenize_ms=%.1f forward_ms=%.1f threads=%d",
        len(requests),
        len(requests) - len(rejected),
        len(rejected),
        stats.sub_batches,
        stats.real_tokens,
        stats.padded_tokens,
        stats.tokenize_ms,
        stats.forward_ms,
        stats.threads,
    )
    for request_id, code in rejected:
        logger.info("request %s rejected: %s", request_id, code)
