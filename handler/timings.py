"""Where each request's time went inside the worker, as response headers named as TEI names
them (the table: docs/api.md). Every time starts when the handler received the batch:
TorchServe 0.12 passes the worker no arrival time; only ``x-wait-time`` reaches back to the
client's own start stamp."""

from __future__ import annotations

from collections.abc import Sequence

from handler.values import BatchStats

COMPUTE_TIME = "x-compute-time"
TOKENIZATION_TIME = "x-tokenization-time"
QUEUE_TIME = "x-queue-time"
INFERENCE_TIME = "x-inference-time"
BATCH_SIZE = "x-batch-size"
WAIT_TIME = "x-wait-time"
TIMING_HEADERS = (COMPUTE_TIME, TOKENIZATION_TIME, QUEUE_TIME, INFERENCE_TIME, BATCH_SIZE)

Headers = tuple[tuple[str, str], ...]


def milliseconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def timing_headers(
    requests: int, text_owners: Sequence[int], stats: BatchStats, received: float
) -> list[Headers]:
    """One set of headers per request. ``text_owners[k]`` is the request index of the k-th
    text the classifier was given; ``received`` the handler's ``perf_counter`` at receipt."""
    forwarded: list[set[int]] = [set() for _ in range(requests)]
    if len(stats.sub_batch_of) == len(text_owners) and stats.forward_started:
        for owner, batches_of_text in zip(text_owners, stats.sub_batch_of, strict=True):
            forwarded[owner].update(batches_of_text)
    common = ((COMPUTE_TIME, milliseconds(stats.handler_ms)), (BATCH_SIZE, str(requests)))
    headers: list[Headers] = []
    for sub_batches in forwarded:
        if not sub_batches:
            headers.append(common)
            continue
        first_start = min(stats.forward_started[i] for i in sub_batches)
        queue_ms = (first_start - received) * 1000 - stats.tokenize_ms
        inference_ms = sum(stats.sub_batch_forward_ms[i] for i in sub_batches)
        headers.append(
            (
                *common,
                (TOKENIZATION_TIME, milliseconds(stats.tokenize_ms)),
                (QUEUE_TIME, milliseconds(queue_ms)),
                (INFERENCE_TIME, milliseconds(inference_ms)),
            )
        )
    return headers


def wait_header(start: float | None, began: float) -> Headers:
    """For a request that stated its start (``X-Request-Start``, unix time): from that start to
    the batch's start (``began``, unix time) by the worker's clock, the wait TorchServe 0.12
    does not tell the worker; 0 for a start in the worker's future."""
    return () if start is None else ((WAIT_TIME, milliseconds((began - start) * 1000)),)
