"""The batch as a whole: validate each item, classify the valid ones together, answer each.

``run_batch`` is what the TorchServe handler calls; it never raises. Each request gets
exactly one ``Response``, at its own index, whatever its batch-mates sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from handler.decoding import Decoded, Rejected, ValidText, decode_request
from handler.errors import HTTP_STATUS, ErrorCode, error_body
from handler.inference import BatchStats, Prediction

logger = logging.getLogger(__name__)

Outcome = Prediction | Rejected
Classifier = Callable[[Sequence[str]], tuple[list[Prediction], BatchStats]]
BatchObserver = Callable[[Sequence[Outcome], BatchStats], None]


@dataclass(frozen=True)
class IncomingRequest:
    """One request as TorchServe delivered it, reduced to what the handler reads."""

    fields: dict[str, Any]
    content_type: str | None
    request_id: str


@dataclass(frozen=True)
class Response:
    status: int
    phrase: str
    body: str


def safe_decode(request: IncomingRequest, max_chars: int) -> Decoded:
    try:
        return decode_request(request.fields, request.content_type, max_chars)
    except Exception:
        logger.exception("request %s: decoding raised; this is a bug", request.request_id)
        return Rejected(ErrorCode.INTERNAL_ERROR, "the request could not be decoded (server bug)")


def classify_valid(
    decoded: Sequence[Decoded], classifier: Classifier
) -> tuple[list[Outcome], BatchStats]:
    """Run the valid items in one call and put each result back at its own index."""
    valid = [(i, item.text) for i, item in enumerate(decoded) if isinstance(item, ValidText)]
    valid_positions = [i for i, _ in valid]
    texts = [text for _, text in valid]
    outcomes: list[Outcome] = [
        item if isinstance(item, Rejected) else _placeholder() for item in decoded
    ]
    if not texts:
        return outcomes, BatchStats()
    try:
        predictions, stats = classifier(texts)
        if len(predictions) != len(texts):
            raise AssertionError(
                f"classifier returned {len(predictions)} predictions for {len(texts)} texts; this is a bug"
            )
    except Exception:
        logger.exception("classifying a batch of %d texts failed", len(texts))
        failure = Rejected(ErrorCode.INTERNAL_ERROR, "the model failed on this batch; retry later")
        for i in valid_positions:
            outcomes[i] = failure
        return outcomes, BatchStats(texts=len(texts))
    for i, prediction in zip(valid_positions, predictions, strict=True):
        outcomes[i] = prediction
    return outcomes, stats


def _placeholder() -> Rejected:
    return Rejected(ErrorCode.INTERNAL_ERROR, "no result was produced for this item (server bug)")


def render(outcome: Outcome, request_id: str) -> Response:
    if isinstance(outcome, Rejected):
        status, phrase = HTTP_STATUS[outcome.code]
        body: dict[str, Any] = error_body(outcome.code, outcome.message, request_id)
    else:
        status, phrase = 200, "OK"
        body = {**asdict(outcome), "request_id": request_id}
    return Response(status=status, phrase=phrase, body=json.dumps(body))


def run_batch(
    requests: Sequence[IncomingRequest],
    classifier: Classifier,
    max_chars: int,
    observe: BatchObserver | None = None,
) -> list[Response]:
    """One response per request, in order; an unexpected failure answers 500 to this batch only.

    ``observe`` sees every batch's outcomes and stats (the metrics); it must not raise.
    """
    try:
        decoded = [safe_decode(request, max_chars) for request in requests]
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
        "tokenize_ms=%.1f forward_ms=%.1f",
        len(requests),
        len(requests) - len(rejected),
        len(rejected),
        stats.sub_batches,
        stats.real_tokens,
        stats.padded_tokens,
        stats.tokenize_ms,
        stats.forward_ms,
    )
    for request_id, code in rejected:
        logger.info("request %s rejected: %s", request_id, code)
