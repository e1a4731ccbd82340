"""The batch as a whole: decode each request, classify every valid text together, answer each.

``run_batch`` is what the TorchServe handler calls; it never raises. Each request gets
exactly one ``Response``, at its own index, whatever its batch-mates sent. The wire protocols
(``handler.protocol``) decode and render; this module only flattens their texts, classifies
them and puts each outcome back at its place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from handler import deadline, native, open_inference
from handler.errors import ErrorCode
from handler.inference import BatchStats, Prediction, TextInput, with_options
from handler.protocol import (
    IncomingRequest,
    ItemOutcome,
    Rejected,
    Response,
    Texts,
    ValidText,
    WireProtocol,
)
from handler.settings import HandlerSettings
from handler.timings import Headers, timing_headers

logger = logging.getLogger(__name__)

PROTOCOLS: tuple[WireProtocol[Any], ...] = (
    open_inference.PROTOCOL,
    native.PROTOCOL,
)
"""Asked in this order; the first that claims a request decodes and answers it. The last
claims every request, and answers the failures no protocol could be asked about."""
FALLBACK = PROTOCOLS[-1]


@dataclass(frozen=True)
class ListOutcome:
    """One decoded request's outcomes: a prediction or error per text, in order."""

    request: Texts
    items: tuple[ItemOutcome, ...]


Outcome = ListOutcome | Rejected
Slot = tuple[int, int]
Classifier = Callable[[Sequence[TextInput]], tuple[list[Prediction], BatchStats]]
BatchObserver = Callable[[Sequence[Outcome], BatchStats], None]


@dataclass(frozen=True)
class Decoded:
    """A request as its protocol decoded it, with the protocol that will answer it."""

    protocol: WireProtocol[Any]
    request: Texts | Rejected


def decode(request: IncomingRequest, settings: HandlerSettings) -> Decoded:
    """The first protocol that claims the request decodes it; a raising one is a bug."""
    try:
        for protocol in PROTOCOLS:
            decoded = protocol.decode(request, settings)
            if decoded is not None:
                return Decoded(protocol, decoded)
        raise AssertionError("the last protocol must claim every request; this is a bug")
    except Exception:
        logger.exception("request %s: decoding raised; this is a bug", request.request_id)
        failure = Rejected(
            ErrorCode.INTERNAL_ERROR, "the request could not be decoded (server bug)"
        )
        return Decoded(FALLBACK, failure)


def expire(
    requests: Sequence[IncomingRequest],
    decoded: Sequence[Decoded],
    settings: HandlerSettings,
    now: float,
    pace: deadline.Pace | None = None,
    queue_age_s: float | None = None,
    overloaded: bool = False,
) -> list[Decoded]:
    """The decoded requests, each replaced by its ``deadline_exceeded`` refusal when its
    deadline passed before the batch began, or (for a client that said how long it waits)
    falls before the batch is expected to end (``pace``, from the texts still to be worked
    on): none of its texts is then tokenized or forwarded. While the server is ``overloaded``
    (``handler.queue_age``) the batch is first cut to what ends within half of each kept
    request's wait, whether stated or the budget (``_fit_to_overload``), which holds every
    request with a deadline to it end to end. ``queue_age_s`` dates the requests that carry no
    start stamp (``handler.queue_age``)."""
    budget_s = settings.queue_budget_ms / 1e3
    dues = [deadline.deadline(r.headers, budget_s, now, queue_age_s) for r in requests]
    live = [
        _expired(d, f"passed {now - due:.3f} s before its batch began")
        if due is not None and due < now
        else d
        for d, due in zip(decoded, dues, strict=True)
    ]
    if pace is None:
        return live
    if overloaded:
        live = _fit_to_overload(requests, live, dues, budget_s, now, pace)
    ends = now + pace.expected_s(len(valid_slots([d.request for d in live])))
    late = {
        index
        for index, (d, due, r) in enumerate(zip(live, dues, requests, strict=True))
        if due is not None
        and due < ends
        and not isinstance(d.request, Rejected)
        and deadline.client_wait(r.headers) is not None
    }
    if (
        late
        and pace.is_stale(now)
        and not any(index not in late and _has_texts(d.request) for index, d in enumerate(live))
    ):
        # A batch that works on nothing times nothing: a pace inflated by one slow batch (the
        # first, cold one) would never come down. Once it is stale, the latest deadline is
        # worked on; more often would spend a forward pass on every refused batch of a spike.
        late.discard(max(late, key=lambda index: dues[index] or 0.0))
    return [
        _expired(d, f"would pass {ends - (dues[index] or 0.0):.3f} s before its batch could end")
        if index in late
        else d
        for index, d in enumerate(live)
    ]


OVERLOAD_TARGET_SHARE = 0.5
"""While overloaded, a request is planned to be answered within this share of its wait (its
client's stated wait, else ``queue_budget_ms``) after it arrived. The answer still has to cross
the frontend to a client on a loaded machine, and the budget may be longer than an unstated
client waits (a spike's clients gave up after 0.4 s against the 0.5 s default). On a CPU a
smaller batch costs little more per text, so a batch cut short loses little throughput. Chosen
by measurement (0.5 against 0.6, 0.7 and none: docs/deadlines.md)."""


def _fit_to_overload(
    requests: Sequence[IncomingRequest],
    live: list[Decoded],
    dues: Sequence[float | None],
    budget_s: float,
    now: float,
    pace: deadline.Pace,
) -> list[Decoded]:
    """While overloaded, the batch is cut to what can end in time: first come, first kept,
    each request with a deadline kept while the batch with it (``pace``) ends within
    ``OVERLOAD_TARGET_SHARE`` of its wait after the arrival of every request kept so far; the
    rest are refused unworked. A pace not timed for a while keeps the first, as ``expire``
    does, when nothing else would be worked on."""
    texts = [len(valid_slots([d.request])) for d in live]
    waits = [deadline.client_wait(request.headers) for request in requests]
    candidates = [index for index, due in enumerate(dues) if due is not None and texts[index]]
    batch_texts = sum(texts) - sum(texts[index] for index in candidates)
    ends_by = float("inf")
    refused: list[int] = []
    for index in candidates:
        stated = waits[index]
        wait = budget_s if stated is None else stated
        arrived = (dues[index] or 0.0) - wait
        by = min(ends_by, arrived + OVERLOAD_TARGET_SHARE * wait)
        if now + pace.expected_s(batch_texts + texts[index]) <= by:
            batch_texts += texts[index]
            ends_by = by
        else:
            refused.append(index)
    if refused and batch_texts == 0 and pace.is_stale(now):
        refused.pop(0)
    held_to = (
        "would pass before its batch could end (the server is overloaded: a request is held to"
        f" {OVERLOAD_TARGET_SHARE:.0%} of its wait, {budget_s * 1000:.0f} ms when it states none)"
    )
    return [_expired(d, held_to) if index in refused else d for index, d in enumerate(live)]


def _has_texts(request: Texts | Rejected) -> bool:
    return bool(valid_slots([request]))


def _expired(decoded: Decoded, when: str) -> Decoded:
    message = (
        f"the request's deadline {when}; it was not processed "
        "(retry later, or send a longer X-Request-Timeout)"
    )
    return Decoded(decoded.protocol, Rejected(ErrorCode.DEADLINE_EXCEEDED, message))


def valid_slots(requests: Sequence[Texts | Rejected]) -> list[tuple[Slot, TextInput]]:
    """Every valid text (or pair) of the batch with its place: (request index, item index)."""
    return [
        ((index, j), model_input(item))
        for index, request in enumerate(requests)
        if not isinstance(request, Rejected)
        for j, item in enumerate(request.items)
        if isinstance(item, ValidText)
    ]


def model_input(valid: ValidText) -> TextInput:
    return valid.text if valid.text_pair is None else (valid.text, valid.text_pair)


def assemble(index: int, request: Texts | Rejected, results: dict[Slot, ItemOutcome]) -> Outcome:
    """Put the results back in the order of the request's texts, each answered with its
    request's options."""
    if isinstance(request, Rejected):
        return request
    return ListOutcome(
        request,
        tuple(
            item if isinstance(item, Rejected) else _answered(item, results.get((index, j)))
            for j, item in enumerate(request.items)
        ),
    )


def _answered(valid: ValidText, result: ItemOutcome | None) -> ItemOutcome:
    if result is None:
        return Rejected(
            ErrorCode.INTERNAL_ERROR, "no result was produced for this item (server bug)"
        )
    if isinstance(result, Rejected):
        return result
    return with_options(result, valid.options)


def classify_valid(
    requests: Sequence[Texts | Rejected], classifier: Classifier
) -> tuple[list[Outcome], BatchStats]:
    """Run every valid text of the batch (of every request and protocol) in one call and put
    each result back at its own place."""
    slots = valid_slots(requests)
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
    return [assemble(index, request, results) for index, request in enumerate(requests)], stats


def respond(protocol: WireProtocol[Any], outcome: Outcome, request_id: str) -> Response:
    """The protocol that decoded the request answers it."""
    if isinstance(outcome, Rejected):
        return protocol.refuse(outcome, request_id)
    return protocol.render(outcome.request, outcome.items, request_id)


def refuse(rejected: Rejected, request_id: str) -> Response:
    """A failure answered before any protocol was asked (the handler's last resort)."""
    return FALLBACK.refuse(rejected, request_id)


def run_batch(
    requests: Sequence[IncomingRequest],
    classifier: Classifier,
    settings: HandlerSettings,
    observe: BatchObserver | None = None,
    now: float | None = None,
    pace: deadline.Pace | None = None,
    queue_age_s: float | None = None,
    overloaded: bool = False,
) -> list[Response]:
    """One response per request, in order; an unexpected failure answers 500 to this batch only.

    ``observe`` sees every batch's outcomes and stats (the metrics); it must not raise.
    ``now`` is when the batch began (unix time; the clock by default), for the deadlines;
    ``pace``, the worker's recent batch times, for the deadlines that would pass during it;
    ``queue_age_s``, the frontend queue's wait, for the requests without a start stamp;
    ``overloaded``, whether the frontend is refusing for a full queue (``expire``).
    """
    answered = answer_batch(
        requests,
        classifier,
        settings,
        observe,
        now=now,
        pace=pace,
        queue_age_s=queue_age_s,
        overloaded=overloaded,
    )
    return answered[0]


def answer_batch(
    requests: Sequence[IncomingRequest],
    classifier: Classifier,
    settings: HandlerSettings,
    observe: BatchObserver | None = None,
    received: float | None = None,
    now: float | None = None,
    pace: deadline.Pace | None = None,
    queue_age_s: float | None = None,
    overloaded: bool = False,
) -> tuple[list[Response], list[Headers]]:
    """``run_batch``, plus each request's timing headers (``handler.timings``), counted from
    ``received`` (the handler's ``time.perf_counter()`` when TorchServe handed it the batch).
    With ``pace``, a request that cannot end before its deadline is refused too, and the
    batch's time is recorded in it; ``queue_age_s`` and ``overloaded``, see ``expire``."""
    received = time.perf_counter() if received is None else received
    began = time.time() if now is None else now
    try:
        decoded = [decode(request, settings) for request in requests]
        decoded = expire(requests, decoded, settings, began, pace, queue_age_s, overloaded)
        outcomes, stats = classify_valid([d.request for d in decoded], classifier)
        owners = [index for (index, _), _ in valid_slots([d.request for d in decoded])]
    except Exception:
        logger.exception("batch of %d failed unexpectedly; this is a bug", len(requests))
        failure = Rejected(ErrorCode.INTERNAL_ERROR, "the batch failed (server bug)")
        decoded = [Decoded(FALLBACK, failure)] * len(requests)
        outcomes, stats, owners = [failure] * len(requests), BatchStats(), []
    stats.handler_ms = (time.perf_counter() - received) * 1000
    if pace is not None:
        pace.record(len(owners), stats.handler_ms / 1000, at=began)
    _log_batch(requests, outcomes, stats, queue_age_s, overloaded)
    if observe is not None:
        observe(outcomes, stats)
    responses = [
        respond(d.protocol, outcome, request.request_id)
        for d, outcome, request in zip(decoded, outcomes, requests, strict=True)
    ]
    timings = timing_headers(len(requests), owners, stats, received)
    return responses, [
        headers + RETRY_LATER if _is_expired(outcome) else headers
        for headers, outcome in zip(timings, outcomes, strict=True)
    ]


RETRY_LATER = (("Retry-After", "1"),)
"""On a ``deadline_exceeded`` refusal: the queue was too long; a second is the least the
header can say (whole seconds), and the client adds its own jittered backoff."""


def _is_expired(outcome: Outcome) -> bool:
    return isinstance(outcome, Rejected) and outcome.code == ErrorCode.DEADLINE_EXCEEDED


def _log_batch(
    requests: Sequence[IncomingRequest],
    outcomes: Sequence[Outcome],
    stats: BatchStats,
    queue_age_s: float | None,
    overloaded: bool = False,
) -> None:
    """One line per batch; ``queue_age_ms`` is the frontend queue time the batch was dated
    by (``handler.queue_age``), ``-`` when it was not read; ``overloaded=1`` while the
    frontend refuses for a full queue."""
    rejected = [
        (r.request_id, o.code.value)
        for r, o in zip(requests, outcomes, strict=True)
        if isinstance(o, Rejected)
    ]
    expired = sum(map(_is_expired, outcomes))
    logger.info(
        "batch_size=%d valid=%d rejected=%d sub_batches=%s real_tokens=%d padded_tokens=%d "
        "tokenize_ms=%.1f forward_ms=%.1f threads=%d expired=%d queue_age_ms=%s overloaded=%d",
        len(requests),
        len(requests) - len(rejected),
        len(rejected),
        stats.sub_batches,
        stats.real_tokens,
        stats.padded_tokens,
        stats.tokenize_ms,
        stats.forward_ms,
        stats.threads,
        expired,
        "-" if queue_age_s is None else f"{queue_age_s * 1000:.0f}",
        overloaded,
    )
    for request_id, code in rejected:
        logger.info("request %s rejected: %s", request_id, code)
