"""A small client for the bert-serve HTTP API, built on `requests`.

`Client.classify(text)` sends one text (or a pair: `text_pair=`) and raises a
`BertServeError` subclass if it fails. `Client.classify_many(texts)` sends list requests
(`{"texts": [...]}`) of at most `chunk_size` texts and `max_request_bytes` bytes,
`concurrency` at a time, and returns one `ItemResult` per text, in order: a bad text fails
alone, as it does on the server. A text is a `str`, or a `(text, text_pair)` tuple for the
sentence-pair models (NLI, cross-encoders). Both take the API's options: `top_k` (keep the k
best labels in `scores`), `raw_scores` (the logits, no softmax or sigmoid) and `windows` (a
text over the server's `max_length` tokens classified whole, as overlapping windows, or on its
first tokens; unset, the model's `long_texts` setting decides; docs/api.md, "Long texts"). A
list request whose texts make more windows than the server takes at once
(`max_windows_per_request`) is refused whole with 413; `classify_many` then sends its halves.

The errors, one class per way a call fails, are drawn in `bert_serve.exceptions`.
Every answer that means "the worker is gone" (`is_worker_gone`), 503, 429, 504
`deadline_exceeded`, connection errors and attempts that get no answer within `timeout` are
retried with exponential backoff and full jitter, never sooner than the server's `Retry-After`,
and no attempt starts later than `retry_budget` seconds into the call, so a spike is not fed
by its own retries (docs/deadlines.md). Classification is idempotent, so sending a text twice
is harmless. Each attempt says how long it waits (`X-Request-Timeout`) and, unless
`stamp_deadline=False`, when it started by this machine's clock (`X-Request-Start`), so the
server does no work for an attempt already given up. A clock behind the server's would make
every stamped attempt look late: the server's `x-wait-time` (from the stamp to its batch, by its
clock) longer than the attempt has lasted shows by how much, and later stamps add that.
The per-attempt deadline is what keeps a call from hanging: TorchServe 0.12 drops, without any answer, the requests a worker
had collected for its next batch when that worker dies (docs/chaos/README.md, "When a worker
dies"). In `classify_many`, an error that would repeat for every chunk (`repeats_for_every_chunk`)
raises; any other failure of a chunk becomes that chunk's items' error, and the other chunks go on.

`Client.explain(text)` asks `/explanations/<model>` which tokens made the label (or `target=`):
an `Explanation` of `words`, `importances` (one per word, L2-normalised) and `delta`.

Only the v1-style API is spoken (`/predictions/<model>`): the Open Inference (v2) route answers
the same predictions with no per-item errors (one bad text fails its whole request), and
tritonclient already speaks it.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from functools import partial
from pathlib import Path
from typing import Any, Union

import requests

from bert_serve.exceptions import (
    BadResponse,
    BodyTooLarge,
    ConnectError,
    DeadlineExceeded,
    ErrorCode,
    InvalidKeyFile,
    ModelNotFound,
    RequestFailed,
    TextTooLong,
    Timeout,
    Unauthorized,
    Unavailable,
    UnexpectedStatus,
    WorkerDied,
    rejected,
)
from bert_serve.exceptions import BertServeError as BertServeError  # its old home, re-exported

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_MODEL = "bert"
# TorchServe counts a list request as one item of its batch: an idle worker takes every request
# that arrives within maxBatchDelay, up to batchSize. With fewer requests in flight than
# batchSize x workers (both sized by the server at its start), most land on one worker while the
# others idle; measured with the default server (make bench, client_lists), 16 texts x 32 in
# flight was 1.8x as fast as 64 x 4.
DEFAULT_CHUNK_SIZE = 16
DEFAULT_CONCURRENCY = 32
# The server's max_request_size (config/config.properties; TorchServe's own default is 6553500
# bytes; a unit test keeps the two equal): a bigger body is refused 413 before any worker sees it.
DEFAULT_MAX_REQUEST_BYTES = 1_048_576
# The server's responseTimeout (config/model-config.yaml; a unit test keeps the two equal):
# TorchServe kills a worker whose batch runs longer and answers that batch "Worker died.", so
# a request that is really being worked on is answered within it. The margin covers the
# batch delay and a queue of a few batches. An attempt with no answer by then was lost.
SERVER_RESPONSE_TIMEOUT_S = 60.0
ATTEMPT_MARGIN_S = 10.0
DEFAULT_TIMEOUT_S = SERVER_RESPONSE_TIMEOUT_S + ATTEMPT_MARGIN_S
RETRY_STATUSES = frozenset({429, 503, 507})
DEFAULT_RETRY_BUDGET_S = 120.0
WAIT_TIME_HEADER = "x-wait-time"
"""The server's milliseconds from an attempt's `X-Request-Start` to the start of its batch, by the
server's clock (docs/api.md): longer than the attempt has lasted, it shows this clock behind."""
# TorchServe's messages for requests whose worker went away (WorkerThread.java,
# BatchAggregator.java); its status varies: 500, 507 (exit code 137), or the worker's own.
WORKER_GONE_MESSAGES = frozenset({"Worker died.", "Worker scaled down."})

Text = Union[str, tuple[str, str]]  # not `|`: the client supports Python 3.9
"""One input: a text, or a (text, text_pair) pair for a sentence-pair model."""


@dataclass(frozen=True)
class Prediction:
    """The wire shape of the handler's answer, mirrored rather than imported: the client must
    not pull in torch. `labels` is set by a multi-label model only: every label at or over its
    threshold, best first. With `raw_scores`, `score` and `scores` are logits; with `top_k`,
    `scores` holds the k best labels, best first."""

    label: str
    score: float
    scores: dict[str, float]
    truncated: bool
    labels: tuple[str, ...] | None = None
    windows: int | None = None
    """The windows a long text was classified as (2 or more); None for a text in one."""

    @classmethod
    def from_json(cls, body: Any) -> Prediction:
        try:
            labels = body.get("labels")
            if labels is not None and not isinstance(labels, list):
                raise TypeError(f"labels must be a list, got {type(labels).__name__}")
            windows = body.get("windows")
            if windows is not None and (isinstance(windows, bool) or not isinstance(windows, int)):
                raise TypeError(f"windows must be a whole number, got {windows!r}")
            return cls(
                label=str(body["label"]),
                score=float(body["score"]),
                scores={str(k): float(v) for k, v in body["scores"].items()},
                truncated=bool(body.get("truncated", False)),
                labels=None if labels is None else tuple(str(label) for label in labels),
                windows=windows,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BadResponse(f"not a prediction: {body!r:.200}") from error

    def to_json(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "label": self.label,
            "score": self.score,
            "scores": self.scores,
            "truncated": self.truncated,
        }
        if self.labels is not None:
            fields["labels"] = list(self.labels)
        if self.windows is not None:
            fields["windows"] = self.windows
        return fields


@dataclass(frozen=True)
class Explanation:
    """The wire shape of an explanation: the tokens as the server's tokenizer split them, one
    importance per token (integrated gradients, summed over the hidden size, L2-normalised:
    positive pushed towards `label`), Captum's convergence `delta`, the label explained and
    its score."""

    words: tuple[str, ...]
    importances: tuple[float, ...]
    delta: float
    label: str
    score: float
    truncated: bool
    n_steps: int

    @classmethod
    def from_json(cls, body: Any) -> Explanation:
        try:
            words = tuple(str(word) for word in body["words"])
            importances = tuple(float(value) for value in body["importances"])
            if len(words) != len(importances):
                raise ValueError(f"{len(words)} words but {len(importances)} importances")
            return cls(
                words=words,
                importances=importances,
                delta=float(body["delta"]),
                label=str(body["label"]),
                score=float(body["score"]),
                truncated=bool(body.get("truncated", False)),
                n_steps=int(body["n_steps"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BadResponse(f"not an explanation: {body!r:.200}") from error

    def to_json(self) -> dict[str, Any]:
        return {
            "words": list(self.words),
            "importances": list(self.importances),
            "delta": self.delta,
            "label": self.label,
            "score": self.score,
            "truncated": self.truncated,
            "n_steps": self.n_steps,
        }


@dataclass(frozen=True)
class ItemError:
    """Why one text of `classify_many` failed: `code` is the server's (see
    `bert_serve.exceptions.ErrorCode`) or, when its whole chunk failed, that error's code."""

    code: str
    message: str


@dataclass(frozen=True)
class ItemResult:
    """The outcome for one text of `classify_many`: exactly one of the two fields is set."""

    prediction: Prediction | None = None
    error: ItemError | None = None

    def __post_init__(self) -> None:
        if (self.prediction is None) == (self.error is None):
            raise ValueError("an ItemResult holds a prediction or an error, not both or neither")

    @property
    def ok(self) -> bool:
        return self.prediction is not None

    def to_json(self) -> dict[str, Any]:
        if self.prediction is not None:
            return self.prediction.to_json()
        assert self.error is not None
        return {"error": {"code": self.error.code, "message": self.error.message}}


def token_from_key_file(path: str | Path, kind: str = "inference") -> str:
    """A token (`inference`, or `management` for `bert-serve models`) from the `key_file.json`
    TorchServe writes when token auth is on."""
    try:
        return str(json.loads(Path(path).read_text())[kind]["key"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InvalidKeyFile(f"cannot read a {kind} key from {path}: {error}") from error


def score_options(
    top_k: int | None = None, raw_scores: bool = False, windows: bool | None = None
) -> dict[str, Any]:
    """The request's option fields; checked here, since a bad one would fail every chunk.
    `windows` is sent only when given (None: the model's `long_texts` setting decides)."""
    options: dict[str, Any] = {}
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a whole number of at least 1, got {top_k!r}")
        options["top_k"] = top_k
    if not isinstance(raw_scores, bool):
        raise ValueError(f"raw_scores must be True or False, got {raw_scores!r}")
    if raw_scores:
        options["raw_scores"] = True
    if windows is not None:
        if not isinstance(windows, bool):
            raise ValueError(f"windows must be True, False or None, got {windows!r}")
        options["windows"] = windows
    return options


def wire_item(text: Text) -> str | dict[str, str]:
    """A text as a list request carries it: the string, or `{"text", "text_pair"}`."""
    if isinstance(text, str):
        return text
    if isinstance(text, tuple) and len(text) == 2 and all(isinstance(t, str) for t in text):
        return {"text": text[0], "text_pair": text[1]}
    raise TypeError(
        f"a text must be a str or a (text, text_pair) tuple of str, got {type(text).__name__}"
    )


def chunk_texts(
    texts: Iterable[Text],
    chunk_size: int,
    max_request_bytes: int,
    options: Mapping[str, Any] | None = None,
) -> Iterator[list[Text]]:
    """Consecutive groups of at most `chunk_size` texts whose JSON body stays under the byte cap.

    A text too big for the cap on its own still goes, alone: the server then answers
    `payload_too_large` for it and only for it.
    """
    empty_size = len(json.dumps({"texts": [], **(options or {})}))
    chunk: list[Text] = []
    size = empty_size
    for text in texts:
        text_bytes = len(json.dumps(wire_item(text))) + 2
        if chunk and (len(chunk) == chunk_size or size + text_bytes > max_request_bytes):
            yield chunk
            chunk, size = [], empty_size
        chunk.append(text)
        size += text_bytes
    if chunk:
        yield chunk


def error_from_response(response: requests.Response) -> BertServeError:
    """The handler's `{"error": {...}}`, or TorchServe's `{"code", "type", "message"}`, as its
    exception class (the tree in `bert_serve.exceptions`)."""
    status, request_id = response.status_code, response.headers.get("x-request-id")
    try:
        body = response.json()
    except ValueError:
        body = None
    if is_worker_gone(response):
        gone = _torchserve_message(body) in WORKER_GONE_MESSAGES or status == 507
        cls = WorkerDied if gone else Unavailable
        message = _torchserve_message(body) or response.reason or "no message"
        return cls(message, status=status, request_id=request_id)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        if status == 401 and error.get("code") == Unauthorized.code:
            hint = "the proxy wants the deployment's key (key=, --key or $BERT_SERVE_KEY)"
            return Unauthorized(
                f"{error.get('message')}; {hint}",
                status=status,
                request_id=body.get("request_id", request_id),
            )
        return rejected(
            str(error.get("code")),
            str(error.get("message")),
            status,
            body.get("request_id", request_id),
        )
    kind = body.get("type", "") if isinstance(body, dict) else ""
    message = _torchserve_message(body) if isinstance(body, dict) else response.text
    shown = message or kind or response.reason or "no message"
    if kind == "InvalidKeyException" or status in (401, 403):
        hint = "token auth is on: pass the inference key (token=, --token or --key-file)"
        return Unauthorized(f"{shown}; {hint}", status=status, request_id=request_id)
    if status == 404:
        return ModelNotFound(shown, status=status, request_id=request_id)
    if status == 413:
        return BodyTooLarge(shown, status=status, request_id=request_id)
    return UnexpectedStatus(shown, code=f"http_{status}", status=status, request_id=request_id)


def _torchserve_message(body: Any) -> str:
    return str(body.get("message") or "") if isinstance(body, dict) else ""


def is_worker_gone(response: requests.Response) -> bool:
    """True for TorchServe's answer to a request whose worker died, whatever its status, and
    for 503 (queue full), 429 and 507.

    Only TorchServe's own error body counts (`{"code", "type", "message"}`); the handler's
    errors (`{"error": ...}`) and a bare 413 from the body-size limit are final answers.
    """
    if response.status_code in RETRY_STATUSES:
        return True
    try:
        body = response.json()
    except ValueError:
        return False
    return (
        isinstance(body, dict)
        and "error" not in body
        and body.get("message") in WORKER_GONE_MESSAGES
    )


def repeats_for_every_chunk(error: BertServeError) -> bool:
    """An error no other chunk would escape: a bad token, an unknown model, no server, a
    request `requests` cannot send, or TorchServe refusing the request's form."""
    if isinstance(error, (Unauthorized, ModelNotFound, ConnectError, RequestFailed)):
        return True
    return isinstance(error, UnexpectedStatus) and error.status in (400, 405)


def is_split_worthy(error: BertServeError) -> bool:
    """A list request the handler refused whole as too large (413 `payload_too_large`): more
    windows than `max_windows_per_request`, or more texts than `max_texts_per_request`; fewer
    texts may pass. A text over `max_chars` is refused alone, inside a 200, so never this."""
    return isinstance(error, TextTooLong) and error.code == ErrorCode.PAYLOAD_TOO_LARGE


def backoff_delays(retries: int, base: float, cap: float) -> Iterator[float]:
    """Full-jitter exponential backoff: spreads clients that were refused at the same moment."""
    for attempt in range(retries):
        yield random.uniform(0, min(cap, base * 2**attempt))


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds (a fraction accepted) or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def observed_lag(wait_time_ms: str | None, lasted_s: float) -> float | None:
    """How far, at least, the stamp was behind the server's clock: its `x-wait-time` (from the
    stamp to its batch, by the server's clock) less the attempt's own duration, which the true
    wait cannot exceed; None when the answer shows no lag (or has no such header)."""
    try:
        waited = float(wait_time_ms or "") / 1000
    except ValueError:
        return None
    behind = waited - lasted_s
    return behind if math.isfinite(behind) and behind > 0 else None


def is_retried(error: BertServeError) -> bool:
    """The failures another attempt may escape: no answer, a full queue or a gone worker, and
    a deadline that passed while the request waited."""
    return isinstance(error, (ConnectError, Timeout, Unavailable, WorkerDied, DeadlineExceeded))


class Client:
    """Talks to one bert-serve model (`model`, at its default version unless `version`); safe
    to share between threads.

    `timeout` is the deadline of one attempt (connect, and each wait for the answer); the
    default follows from the server's responseTimeout (`DEFAULT_TIMEOUT_S`). A call makes at
    most retries + 1 attempts, sleeps between them at least the server's `Retry-After`, and
    starts none after `retry_budget` seconds: it takes at most retry_budget + timeout.
    Each attempt states `timeout` (`X-Request-Timeout`); `stamp_deadline` also sends its start
    by this machine's clock (`X-Request-Start`), which gives it a deadline on the server
    (docs/deadlines.md). A stamp behind the server's clock is corrected by what the server's
    answers show (`clock_lag`); `stamp_deadline=False` sends no start, so the server sets no
    deadline unless a proxy in front of it stamps the arrival.

    `token` is TorchServe's own inference key (token authorization, on in `make serve`'s
    server); `key` is the deployment's key, checked by the NGINX proxy in front of TorchServe
    (deploy/k8s), which strips it. Both travel as `Authorization: Bearer`, so give one.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        model: str = DEFAULT_MODEL,
        version: str | None = None,
        token: str | None = None,
        key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = 4,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        retry_budget: float = DEFAULT_RETRY_BUDGET_S,
        stamp_deadline: bool = True,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        route = f"{model}/{version}" if version else model
        self.predict_url = f"{url.rstrip('/')}/predictions/{route}"
        self.explain_url = f"{url.rstrip('/')}/explanations/{route}"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retry_budget = retry_budget
        self.stamp_deadline = stamp_deadline
        self._sleep = sleep
        self._clock = clock
        self._lag_lock = threading.Lock()
        self.clock_lag = 0.0
        """Seconds this machine's clock is at least behind the server's, as its answers showed
        (`observed_lag`); added to every start stamp."""
        if token and key:
            raise ValueError(
                "give token= (TorchServe's own key) or key= (the proxy's), not both: each is "
                "sent as Authorization: Bearer"
            )
        bearer = key or token
        self._headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _post(self, payload: dict[str, Any], url: str | None = None) -> dict[str, Any]:
        """POST to `url` (the predictions route by default) with retries (`is_retried`) within
        the retry budget; the 200 body, or the error's exception."""
        headers = {
            **self._headers,
            "X-Request-ID": f"bert-serve-{uuid.uuid4().hex}",
            "X-Request-Timeout": f"{self.timeout:g}",  # relative: no clock in it
        }
        delays = backoff_delays(self.retries, self.backoff, self.max_backoff)
        started = self._clock()
        while True:
            outcome = self._attempt(payload, headers, url or self.predict_url)
            if isinstance(outcome, dict):
                return outcome
            failure, retry_after = outcome
            if not is_retried(failure):
                raise failure
            delay = next(delays, None)
            if delay is None:
                raise failure
            if retry_after is not None:
                delay = max(delay, retry_after + random.uniform(0, self.backoff))
            if self._clock() - started + delay > self.retry_budget:
                raise failure
            self._sleep(delay)

    def _attempt(
        self, payload: dict[str, Any], headers: dict[str, str], url: str
    ) -> dict[str, Any] | tuple[BertServeError, float | None]:
        """One POST: the 200 body, or the error it ended with and the server's Retry-After."""
        stamped = dict(headers)
        lag = self.clock_lag
        if self.stamp_deadline:
            stamped["X-Request-Start"] = f"t={time.time() + lag:.3f}"
        sent = time.monotonic()
        try:
            response = self._session().post(
                url, json=payload, headers=stamped, timeout=self.timeout
            )
        except requests.ConnectionError as error:
            return ConnectError(f"{url}: {error}"), None
        except requests.Timeout as error:
            return Timeout(f"no answer within {self.timeout} s: {error}"), None
        except requests.RequestException as error:
            raise RequestFailed(f"{url}: {error}") from error
        if self.stamp_deadline:
            behind = observed_lag(response.headers.get(WAIT_TIME_HEADER), time.monotonic() - sent)
            if behind is not None:
                with self._lag_lock:
                    self.clock_lag = max(self.clock_lag, lag + behind)
        if response.status_code == 200:
            return _json_object(response)
        retry_after = retry_after_seconds(response.headers.get("Retry-After"), time.time())
        return error_from_response(response), retry_after

    def classify(
        self,
        text: str,
        text_pair: str | None = None,
        *,
        top_k: int | None = None,
        raw_scores: bool = False,
        windows: bool | None = None,
    ) -> Prediction:
        """One text, or one pair; raises the error's class (`bert_serve.exceptions`) if it
        fails, a `Rejected` with the server's code if the server refuses it."""
        payload: dict[str, Any] = {"text": text, **score_options(top_k, raw_scores, windows)}
        if text_pair is not None:
            payload["text_pair"] = text_pair
        return Prediction.from_json(self._post(payload))

    def explain(
        self,
        text: str,
        text_pair: str | None = None,
        *,
        target: str | int | None = None,
        n_steps: int | None = None,
    ) -> Explanation:
        """Which tokens made the label: the predicted one, or `target` (a label or a class
        index); `n_steps` fewer integrated-gradients steps than the server's default (faster,
        less exact). Raises as `classify` does; `explain_too_long` (413) for a text over the
        server's `explain_max_tokens`."""
        payload: dict[str, Any] = {"text": text}
        if text_pair is not None:
            payload["text_pair"] = text_pair
        if target is not None:
            if isinstance(target, bool) or not isinstance(target, (str, int)):
                raise ValueError(f"target must be a label or a class index, got {target!r}")
            payload["target"] = target
        if n_steps is not None:
            if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
                raise ValueError(f"n_steps must be a whole number of at least 1, got {n_steps!r}")
            payload["n_steps"] = n_steps
        return Explanation.from_json(self._post(payload, self.explain_url))

    def classify_chunk(
        self,
        texts: list[Text],
        *,
        top_k: int | None = None,
        raw_scores: bool = False,
        windows: bool | None = None,
    ) -> list[ItemResult]:
        """One list request; a failure of the whole request becomes every item's error, except
        a list refused as too large (`is_split_worthy`: its texts make more windows than the
        server takes in one request), whose halves are sent in turn."""
        items = [wire_item(text) for text in texts]
        try:
            body = self._post({"texts": items, **score_options(top_k, raw_scores, windows)})
        except BertServeError as error:
            if repeats_for_every_chunk(error):
                raise
            if len(texts) > 1 and is_split_worthy(error):
                half = len(texts) // 2
                send = partial(
                    self.classify_chunk, top_k=top_k, raw_scores=raw_scores, windows=windows
                )
                return send(texts[:half]) + send(texts[half:])
            return [ItemResult(error=ItemError(error.code, error.message))] * len(texts)
        results = body.get("results")
        if not isinstance(results, list) or len(results) != len(texts):
            raise BadResponse(f"expected {len(texts)} results, got {body!r:.200}")
        return [_item_result(entry) for entry in results]

    def classify_iter(
        self,
        texts: Iterable[Text],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        concurrency: int = DEFAULT_CONCURRENCY,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        top_k: int | None = None,
        raw_scores: bool = False,
        windows: bool | None = None,
    ) -> Iterator[ItemResult]:
        """Results in input order as they arrive, with at most `concurrency` requests in flight.

        Reads `texts` lazily, so a large file never sits in memory whole.
        """
        if chunk_size < 1 or concurrency < 1:
            raise ValueError(
                f"chunk_size and concurrency must be >= 1, got {chunk_size} and {concurrency}"
            )
        options = score_options(top_k, raw_scores, windows)
        chunks = chunk_texts(texts, chunk_size, max_request_bytes, options)
        send = partial(self.classify_chunk, top_k=top_k, raw_scores=raw_scores, windows=windows)
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bert-serve") as pool:
            pending: deque[Future[list[ItemResult]]] = deque()
            try:
                for chunk in chunks:
                    pending.append(pool.submit(send, chunk))
                    if len(pending) >= concurrency:
                        yield from pending.popleft().result()
                while pending:
                    yield from pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()

    def classify_many(self, texts: Iterable[Text], **options: Any) -> list[ItemResult]:
        """All results, in order; see `classify_iter` for the options."""
        return list(self.classify_iter(texts, **options))


def _json_object(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise BadResponse(
            f"expected a JSON object, got {response.text!r:.200}", status=response.status_code
        )
    return body


def _item_result(entry: Any) -> ItemResult:
    if isinstance(entry, dict) and isinstance(entry.get("error"), dict):
        error = entry["error"]
        return ItemResult(error=ItemError(str(error.get("code")), str(error.get("message"))))
    return ItemResult(prediction=Prediction.from_json(entry))
