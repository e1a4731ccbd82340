"""The batch as a whole: decode each request, classify every valid text together, answer each.

``answer_batch`` never raises; each request gets exactly one ``Response``, at its own index.
The wire protocols (``handler.protocol``) decode and render; this module never asks which.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handler import deadline, native, open_inference
from handler.inference import Admit, OutOfMemory, with_options
from handler.protocol import WireProtocol
from handler.settings import HandlerSettings
from handler.values import (
    BatchStats,
    ErrorCode,
    ExplainOptions,
    Explanation,
    IncomingRequest,
    ItemOutcome,
    ListOutcome,
    Outcome,
    Prediction,
    Rejected,
    Response,
    TextInput,
    Texts,
    ValidText,
)

logger = logging.getLogger(__name__)

PROTOCOLS: tuple[WireProtocol[Any], ...] = (open_inference.PROTOCOL, native.PROTOCOL)
"""Asked in this order; the first that claims a request decodes and answers it. The last
claims every request, and answers the failures no protocol could be asked about."""
FALLBACK = PROTOCOLS[-1]


Slot = tuple[int, int]
Classifier = Callable[
    [Sequence[TextInput], Sequence[bool], Admit | None],
    tuple[Sequence[Prediction | None], BatchStats],
]
"""Each text's prediction, in order: windowed where the flags say, forwarded only where the
``Admit`` keeps it (None in place of the others; ``handler.inference.classify_admitted``)."""
BatchObserver = Callable[[Sequence[Outcome], BatchStats], None]
Explainer = Callable[[Sequence[tuple[TextInput, ExplainOptions]]], list[Explanation | Rejected]]
"""An explanation or error for each text, in order (``explain.explain_all``); should not raise."""


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
    now: float,
    pace: deadline.Pace | None = None,
) -> list[Decoded]:
    """Each request whose deadline passed, or with a ``pace`` would pass before the batch can
    end, replaced by its ``deadline_exceeded`` refusal (the rules: docs/deadlines.md)."""
    dues = [deadline.deadline(request.headers, now) for request in requests]
    live = [
        _expired(d, f"passed {now - due:.3f} s before its batch began")
        if due is not None and due < now
        else d
        for d, due in zip(decoded, dues, strict=True)
    ]
    if pace is None:
        return live
    texts = {i: _valid_count(d.request) for i, d in enumerate(live)}
    ends = late(texts, dict(enumerate(dues)), now, pace)
    return [
        _expired(d, f"would pass {ends[index] - dues[index]:.3f} s before its batch could end")  # type: ignore[operator]
        if index in ends
        else d
        for index, d in enumerate(live)
    ]


def late(
    rows: Mapping[int, int], dues: Mapping[int, float | None], now: float, pace: deadline.Pace
) -> dict[int, float]:
    """The requests (by index) whose deadline would pass before a batch of their ``rows`` (texts,
    or windows once counted) could end, with the end foreseen. Patient requests are kept;
    then the latest deadlines first, each if the batch kept so far and its rows can end before
    it (then every deadline kept before it holds too)."""
    kept = sum(n for i, n in rows.items() if dues.get(i) is None)
    waiting = {i: due for i, due in dues.items() if due is not None and rows.get(i)}
    ends: dict[int, float] = {}
    for index in sorted(waiting, key=waiting.__getitem__, reverse=True):
        end = now + pace.expected_s(kept + rows[index])
        if end <= waiting[index]:
            kept += rows[index]
        else:
            ends[index] = end
    if ends and not kept and pace.is_stale(now):
        # A batch that works on nothing times nothing, so an inflated pace would never come
        # down: once stale (not every time: a spike's every batch), the latest one is worked on.
        del ends[max(ends, key=waiting.__getitem__)]
    return ends


def _valid_count(request: Texts | Rejected) -> int:
    if isinstance(request, Rejected):
        return 0
    return sum(isinstance(item, ValidText) for item in request.items)


def _expired(decoded: Decoded, when: str) -> Decoded:
    return Decoded(decoded.protocol, _deadline_refusal(when))


def _deadline_refusal(when: str) -> Rejected:
    message = (
        f"the request's deadline {when}; it was not processed "
        "(retry later, or send a longer X-Request-Timeout)"
    )
    return Rejected(ErrorCode.DEADLINE_EXCEEDED, message)


@dataclass
class Admission:
    """Which texts of a batch are forwarded, asked as their windows are counted
    (``handler.inference.Admit``): a request past ``limit`` windows answers 413 and is
    tokenized no further; once all are counted, a request whose deadline its windows cannot
    meet at the worker's ``pace`` answers 504 (``late``), unforwarded."""

    limit: int
    dues: Mapping[int, float | None] = field(default_factory=dict)
    """Each request's deadline (unix time), by request index."""
    now: float = 0.0
    pace: deadline.Pace | None = None
    owners: Sequence[int] = ()
    """The request index of each text the classifier is given."""
    refused: dict[int, Rejected] = field(default_factory=dict)
    """By request index."""

    def __call__(self, rows: Mapping[int, int], final: bool) -> set[int]:
        totals: Counter[int] = Counter()
        for text, count in rows.items():
            totals[self.owners[text]] += count
        for owner, total in totals.items():
            if total > self.limit and owner not in self.refused:
                self.refused[owner] = Rejected(
                    ErrorCode.PAYLOAD_TOO_LARGE,
                    f"the request's texts make {total:,} windows of max_length tokens or more; "
                    f"the limit is {self.limit:,} a request (max_windows_per_request): send "
                    'fewer or shorter texts, or "windows": false to classify each on its first '
                    "max_length tokens",
                )
        if final and self.pace is not None:
            live = {owner: n for owner, n in totals.items() if owner not in self.refused}
            for owner, end in late(live, self.dues, self.now, self.pace).items():
                due = self.dues[owner] or 0.0
                self.refused[owner] = _deadline_refusal(
                    f"would pass {end - due:.3f} s before its texts' {live[owner]:,} windows "
                    "could be classified"
                )
        return {text for text, owner in enumerate(self.owners) if owner in self.refused}


def text_slots(requests: Sequence[Texts | Rejected]) -> list[tuple[Slot, ValidText]]:
    """Every valid text (or pair) of the batch with its place: (request index, item index)."""
    return [
        ((index, j), item)
        for index, request in enumerate(requests)
        if not isinstance(request, Rejected)
        for j, item in enumerate(request.items)
        if isinstance(item, ValidText)
    ]


def classify_slots(
    slots: Sequence[tuple[Slot, TextInput]],
    classifier: Classifier,
    windowed: Sequence[bool] | None = None,
    admission: Admission | None = None,
) -> tuple[dict[Slot, ItemOutcome], BatchStats]:
    """Every text in one call, each result at its place; ``windowed``: the texts classified as
    windows; ``admission``: which are forwarded. If that call fails (not for memory), each
    text is classified alone, so a text that breaks the model is a 500 for itself only."""
    texts = [text for _, text in slots]
    if not texts:
        return {}, BatchStats()
    flags = list(windowed) if windowed is not None else [False] * len(texts)
    if admission is not None:
        admission.owners = [index for (index, _), _ in slots]
    outcomes, stats = _classified(texts, flags, classifier, admission)
    if stats is None and len(texts) > 1 and not isinstance(outcomes[0], OutOfMemory):
        logger.warning("classifying %d texts failed; classifying each alone", len(texts))
        refused = admission.refused if admission is not None else {}
        alone = [
            ([None], None) if slot[0] in refused else _classified([text], [flag], classifier, None)
            for (slot, text), flag in zip(slots, flags, strict=True)
        ]
        outcomes = [each[0][0] for each in alone]
        stats = BatchStats(texts=len(texts))
    refusals = admission.refused if admission is not None else {}
    results: dict[Slot, ItemOutcome] = {
        slot: _outcome(outcome, refusals.get(slot[0]))
        for (slot, _), outcome in zip(slots, outcomes, strict=True)
    }
    return results, stats or BatchStats(texts=len(texts))


def _outcome(outcome: Prediction | Exception | None, refusal: Rejected | None) -> ItemOutcome:
    if refusal is not None:
        return refusal
    if isinstance(outcome, Prediction):
        return finite_or_rejected(outcome)
    if outcome is None:
        return Rejected(ErrorCode.INTERNAL_ERROR, "this text was not classified (server bug)")
    return _failed(outcome)


def _failed(error: Exception) -> Rejected:
    if isinstance(error, OutOfMemory):
        message = "the device ran out of memory on this batch; retry later or with shorter texts"
    else:
        message = "the model failed on this batch; retry later"
    return Rejected(ErrorCode.INTERNAL_ERROR, message)


def _classified(
    texts: Sequence[TextInput],
    windowed: Sequence[bool],
    classifier: Classifier,
    admission: Admission | None,
) -> tuple[list[Prediction | Exception | None], BatchStats | None]:
    """The classifier's predictions, or its failure once per text (and no stats)."""
    try:
        predictions, stats = classifier(texts, windowed, admission)
        if len(predictions) != len(texts):
            raise AssertionError(
                f"classifier returned {len(predictions)} predictions for {len(texts)} texts; this is a bug"
            )
        return list(predictions), stats
    except Exception as error:
        logger.exception("classifying a batch of %d texts failed", len(texts))
        return [error] * len(texts), None


NOT_FINITE = Rejected(
    ErrorCode.INTERNAL_ERROR,
    "this text's scores came out as NaN or infinity (possible in bf16 or fp16), which JSON "
    "cannot carry; a server in fp32 answers it",
)


def finite_or_rejected(prediction: Prediction) -> Prediction | Rejected:
    """JSON has no NaN or infinity (``json.dumps`` would write them and no client could read
    them): a prediction with one is a 500 for its text alone."""
    numbers = [*prediction.scores.values(), *(prediction.raw_scores or {}).values()]
    return prediction if all(math.isfinite(value) for value in numbers) else NOT_FINITE


def explain_each(
    slots: Sequence[tuple[Slot, ValidText]], explainer: Explainer | None
) -> dict[Slot, ItemOutcome]:
    """Every text to explain, by ``explainer``, put back at its place; an explainer that raises
    or answers the wrong count is a 500 for these texts only."""
    if explainer is None:
        refused = Rejected(ErrorCode.NOT_EXPLAINABLE, "this server has no explainer")
        return {slot: refused for slot, _ in slots}
    try:
        outcomes = explainer(
            [(model_input(item), item.explain or ExplainOptions()) for _, item in slots]
        )
        if len(outcomes) != len(slots):
            raise AssertionError(f"{len(outcomes)} explanations for {len(slots)} texts")
    except Exception:
        logger.exception("explaining %d texts failed; this is a bug", len(slots))
        failure = Rejected(
            ErrorCode.INTERNAL_ERROR, "the model failed to explain this text; retry later"
        )
        return {slot: failure for slot, _ in slots}
    return {slot: outcome for (slot, _), outcome in zip(slots, outcomes, strict=True)}


def model_input(valid: ValidText) -> TextInput:
    return valid.text if valid.text_pair is None else (valid.text, valid.text_pair)


def assemble(index: int, request: Texts | Rejected, results: dict[Slot, ItemOutcome]) -> Outcome:
    """The request's results in the order of its texts, each with its request's options."""
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
    if isinstance(result, Rejected | Explanation):
        return result
    try:
        return with_options(result, valid.options)
    except Exception:
        logger.exception("applying %s to a prediction failed; this is a bug", valid.options)
        return Rejected(
            ErrorCode.INTERNAL_ERROR, "this item's options could not be applied (server bug)"
        )


def classify_valid(
    requests: Sequence[Texts | Rejected],
    classifier: Classifier,
    explainer: Explainer | None = None,
    admission: Admission | None = None,
    windows: bool = False,
) -> tuple[list[Outcome], BatchStats, list[int]]:
    """Every valid text of the batch classified in one call (as windows where the request, or
    else ``windows``, says so), then those to explain, each result at its own place; also the
    request index of each text classified."""
    valid = text_slots(requests)
    to_classify = [(slot, item) for slot, item in valid if item.explain is None]
    slots = [(slot, model_input(item)) for slot, item in to_classify]
    windowed = [windows if item.windows is None else item.windows for _, item in to_classify]
    results, stats = classify_slots(slots, classifier, windowed, admission)
    to_explain = [(slot, item) for slot, item in valid if item.explain is not None]
    if to_explain:
        started = time.perf_counter()
        results.update(explain_each(to_explain, explainer))
        stats.explained = len(to_explain)
        stats.explain_ms = (time.perf_counter() - started) * 1000
    refused = admission.refused if admission is not None else {}
    outcomes = [
        refused.get(index) or assemble(index, request, results)
        for index, request in enumerate(requests)
    ]
    return outcomes, stats, [index for (index, _), _ in slots]


def respond(protocol: WireProtocol[Any], outcome: Outcome, request_id: str) -> Response:
    """The protocol that decoded the request answers it; a render that raises is this
    request's 500 alone."""
    try:
        if isinstance(outcome, Rejected):
            return protocol.refuse(outcome, request_id)
        return protocol.render(outcome.request, outcome.items, request_id)
    except Exception:
        logger.exception("request %s: rendering its answer raised; this is a bug", request_id)
        failure = Rejected(
            ErrorCode.INTERNAL_ERROR, "the answer could not be rendered (server bug)"
        )
        return FALLBACK.refuse(failure, request_id)


def answer_batch(
    requests: Sequence[IncomingRequest],
    classifier: Classifier,
    settings: HandlerSettings,
    observe: BatchObserver | None = None,
    received: float | None = None,
    now: float | None = None,
    pace: deadline.Pace | None = None,
    explainer: Explainer | None = None,
) -> tuple[list[Response], list[deadline.Headers]]:
    """One response per request, in order, and each one's timing headers. Each stage answers
    an item's failure as that item's outcome; the catch around the batch is for bugs in the
    batch's own code (``expire``, ``classify_valid``'s bookkeeping), and answers 500 to it. ``received``: ``perf_counter()`` at receipt; ``now``: unix
    time the batch began. ``pace`` gets the batch's time unless it explained texts."""
    received = time.perf_counter() if received is None else received
    began = time.time() if now is None else now
    try:
        decoded = [decode(request, settings) for request in requests]
        decoded = expire(requests, decoded, began, pace)
        dues = {i: deadline.deadline(request.headers, began) for i, request in enumerate(requests)}
        admission = Admission(settings.windows_per_request, dues, began, pace)
        outcomes, stats, owners = classify_valid(
            [d.request for d in decoded],
            classifier,
            explainer,
            admission,
            settings.long_texts == "windows",
        )
    except Exception:
        logger.exception("batch of %d failed unexpectedly; this is a bug", len(requests))
        failure = Rejected(ErrorCode.INTERNAL_ERROR, "the batch failed (server bug)")
        decoded = [Decoded(FALLBACK, failure)] * len(requests)
        outcomes, stats, owners = [failure] * len(requests), BatchStats(), []
    stats.handler_ms = (time.perf_counter() - received) * 1000
    if pace is not None and not stats.explained:
        pace.record(sum(stats.windows) or len(owners), stats.handler_ms / 1000, at=began)
    _log_batch(requests, outcomes, stats)
    if observe is not None:
        observe(outcomes, stats)
    responses = [
        respond(d.protocol, outcome, request.request_id)
        for d, outcome, request in zip(decoded, outcomes, requests, strict=True)
    ]
    timings = deadline.timing_headers(len(requests), owners, stats, received)
    return responses, [
        headers
        + deadline.wait_header(deadline.start_time(request.headers), began)
        + (RETRY_LATER if _is_expired(outcome) else ())
        for headers, request, outcome in zip(timings, requests, outcomes, strict=True)
    ]


RETRY_LATER = (("Retry-After", "1"),)
"""On ``deadline_exceeded``: the least the header can say; the client adds jittered backoff."""


def _is_expired(outcome: Outcome) -> bool:
    return isinstance(outcome, Rejected) and outcome.code == ErrorCode.DEADLINE_EXCEEDED


def _log_batch(
    requests: Sequence[IncomingRequest], outcomes: Sequence[Outcome], stats: BatchStats
) -> None:
    """One line per batch (read back by ``lab.batchlog``), and one naming its refused
    requests: a line each would cost a spike of refusals more than the refusals."""
    rejected = [
        (r.request_id, o.code.value)
        for r, o in zip(requests, outcomes, strict=True)
        if isinstance(o, Rejected)
    ]
    expired = sum(map(_is_expired, outcomes))
    logger.info(
        "batch_size=%d valid=%d rejected=%d sub_batches=%s real_tokens=%d padded_tokens=%d "
        "explained=%d explain_ms=%.1f tokenize_ms=%.1f forward_ms=%.1f threads=%d expired=%d",
        len(requests),
        len(requests) - len(rejected),
        len(rejected),
        stats.sub_batches,
        stats.real_tokens,
        stats.padded_tokens,
        stats.explained,
        stats.explain_ms,
        stats.tokenize_ms,
        stats.forward_ms,
        stats.threads,
        expired,
    )
    if rejected:
        logger.info("rejected: %s", " ".join(f"{rid}={code}" for rid, code in rejected))
