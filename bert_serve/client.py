"""A small client for the bert-serve HTTP API, built on `requests`.

`Client.classify(text)` sends one text and raises `BertServeError` if it fails.
`Client.classify_many(texts)` sends list requests (`{"texts": [...]}`) of at most
`chunk_size` texts and `max_request_bytes` bytes, `concurrency` at a time, and returns one
`ItemResult` per text, in order: a bad text fails alone, as it does on the server.

Errors, by where they come from:

    BertServeError(code, message, status, request_id)
      code from the handler's body   empty_text, invalid_encoding, payload_too_large, ...
      code from TorchServe's status  unauthorized (token), model_not_found,
                                     unavailable (503, queue full), worker_died (507, or
                                     "Worker died." with any status), payload_too_large
                                     (413, over max_request_size), http_<status>
      no status                      connection_failed (after the retries), timeout (no answer
                                     within `timeout` on any attempt), bad_response (not the
                                     JSON the API promises), request_failed (e.g. a malformed URL)

Every answer that means "the worker is gone" (`is_worker_gone`), 503, connection errors and
attempts that get no answer within `timeout` are retried with exponential backoff and jitter:
classification is idempotent, so sending a text twice is harmless. The per-attempt deadline is
what keeps a call from hanging: TorchServe 0.12 drops, without any answer, the requests a worker
had collected for its next batch when that worker dies (see README, "When a worker dies").
In `classify_many`, an error that would repeat for every chunk (`REQUEST_WIDE_CODES`) raises;
any other failure of a chunk becomes that chunk's items' error, and the other chunks go on.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_MODEL = "bert"
# TorchServe counts a list request as one item of its batch: an idle worker takes every request
# that arrives within maxBatchDelay, up to batchSize. With fewer requests in flight than
# batchSize x workers (16 x 2 by default), most land on one worker while the others idle; measured
# with the default server (make bench, client_lists), 16 texts x 32 in flight was 1.8x
# as fast as 64 x 4.
DEFAULT_CHUNK_SIZE = 16
DEFAULT_CONCURRENCY = 32
DEFAULT_MAX_REQUEST_BYTES = 1_000_000
# The server's responseTimeout (config/model-config.yaml; a unit test keeps the two equal):
# TorchServe kills a worker whose batch runs longer and answers that batch "Worker died.", so
# a request that is really being worked on is answered within it. The margin covers the
# batch delay and a queue of a few batches. An attempt with no answer by then was lost.
SERVER_RESPONSE_TIMEOUT_S = 60.0
ATTEMPT_MARGIN_S = 10.0
DEFAULT_TIMEOUT_S = SERVER_RESPONSE_TIMEOUT_S + ATTEMPT_MARGIN_S
RETRY_STATUSES = frozenset({503, 507})
# TorchServe's messages for requests whose worker went away (WorkerThread.java,
# BatchAggregator.java); its status varies: 500, 507 (exit code 137), or the worker's own.
WORKER_GONE_MESSAGES = frozenset({"Worker died.", "Worker scaled down."})
REQUEST_WIDE_CODES = frozenset(
    {
        "unauthorized",
        "model_not_found",
        "connection_failed",
        "request_failed",
        "http_400",
        "http_404",
        "http_405",
    }
)
TORCHSERVE_STATUS_CODES = {
    404: "model_not_found",
    413: "payload_too_large",
    503: "unavailable",
    507: "worker_died",
}


class BertServeError(Exception):
    """A request failed; `code` is the server's error code (or one named in the module docstring)."""

    def __init__(
        self, code: str, message: str, status: int | None = None, request_id: str | None = None
    ):
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.code = code
        self.message = message
        self.status = status
        self.request_id = request_id


@dataclass(frozen=True)
class Prediction:
    """The wire shape of handler.inference.Prediction, mirrored rather than imported: the
    client must not pull in torch."""

    label: str
    score: float
    scores: dict[str, float]
    truncated: bool

    @classmethod
    def from_json(cls, body: Any) -> Prediction:
        try:
            return cls(
                label=str(body["label"]),
                score=float(body["score"]),
                scores={str(k): float(v) for k, v in body["scores"].items()},
                truncated=bool(body.get("truncated", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BertServeError("bad_response", f"not a prediction: {body!r:.200}") from error


@dataclass(frozen=True)
class ItemError:
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
            p = self.prediction
            return {
                "label": p.label,
                "score": p.score,
                "scores": p.scores,
                "truncated": p.truncated,
            }
        assert self.error is not None
        return {"error": {"code": self.error.code, "message": self.error.message}}


def token_from_key_file(path: str | Path) -> str:
    """The inference token from the `key_file.json` TorchServe writes when token auth is on."""
    try:
        return str(json.loads(Path(path).read_text())["inference"]["key"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BertServeError(
            "invalid_key_file", f"cannot read an inference key from {path}: {error}"
        ) from error


def chunk_texts(
    texts: Iterable[str], chunk_size: int, max_request_bytes: int
) -> Iterator[list[str]]:
    """Consecutive groups of at most `chunk_size` texts whose JSON body stays under the byte cap.

    A text too big for the cap on its own still goes, alone: the server then answers
    `payload_too_large` for it and only for it.
    """
    chunk: list[str] = []
    size = len(b'{"texts": []}')
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts must be str, got {type(text).__name__}")
        text_bytes = len(json.dumps(text)) + 2
        if chunk and (len(chunk) == chunk_size or size + text_bytes > max_request_bytes):
            yield chunk
            chunk, size = [], len(b'{"texts": []}')
        chunk.append(text)
        size += text_bytes
    if chunk:
        yield chunk


def error_from_response(response: requests.Response) -> BertServeError:
    """The handler's `{"error": {...}}`, or TorchServe's `{"code", "type", "message"}`, as one type."""
    request_id = response.headers.get("x-request-id")
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return BertServeError(
            str(error.get("code")),
            str(error.get("message")),
            response.status_code,
            body.get("request_id", request_id),
        )
    kind = body.get("type", "") if isinstance(body, dict) else ""
    message = body.get("message", "") if isinstance(body, dict) else response.text
    if kind == "InvalidKeyException" or response.status_code in (401, 403):
        code = "unauthorized"
        message = f"{message or kind}; token auth is on: pass the inference key (token=, --token or --key-file)"
    elif message in WORKER_GONE_MESSAGES:
        code = "worker_died"
    else:
        code = TORCHSERVE_STATUS_CODES.get(response.status_code, f"http_{response.status_code}")
    return BertServeError(
        code, message or kind or response.reason or "no message", response.status_code, request_id
    )


def is_worker_gone(response: requests.Response) -> bool:
    """True for TorchServe's answer to a request whose worker died, whatever its status.

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


def backoff_delays(retries: int, base: float, cap: float) -> Iterator[float]:
    """Full-jitter exponential backoff: spreads clients that were refused at the same moment."""
    for attempt in range(retries):
        yield random.uniform(0, min(cap, base * 2**attempt))


class Client:
    """Talks to one bert-serve model; safe to share between threads.

    `timeout` is the deadline of one attempt (connect, and each wait for the answer); the
    default follows from the server's responseTimeout (`DEFAULT_TIMEOUT_S`). A call takes at
    most (retries + 1) x timeout plus the backoff sleeps (each at most `max_backoff`).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        model: str = DEFAULT_MODEL,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = 4,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.predict_url = f"{url.rstrip('/')}/predictions/{model}"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST with retries on a gone worker, 503, connection errors and attempts with no
        answer within `timeout`; the 200 body, or BertServeError."""
        headers = {**self._headers, "X-Request-ID": f"bert-serve-{uuid.uuid4().hex}"}
        delays = backoff_delays(self.retries, self.backoff, self.max_backoff)
        while True:
            try:
                response = self._session().post(
                    self.predict_url, json=payload, headers=headers, timeout=self.timeout
                )
            except requests.ConnectionError as error:
                failure = BertServeError("connection_failed", f"{self.predict_url}: {error}")
            except requests.Timeout as error:
                failure = BertServeError("timeout", f"no answer within {self.timeout} s: {error}")
            except requests.RequestException as error:
                raise BertServeError("request_failed", f"{self.predict_url}: {error}") from error
            else:
                if response.status_code == 200:
                    return _json_object(response)
                failure = error_from_response(response)
                if not is_worker_gone(response):
                    raise failure
            delay = next(delays, None)
            if delay is None:
                raise failure
            self._sleep(delay)

    def classify(self, text: str) -> Prediction:
        """One text; raises BertServeError with the server's code if it is refused."""
        return Prediction.from_json(self._post({"text": text}))

    def classify_chunk(self, texts: list[str]) -> list[ItemResult]:
        """One list request; a failure of the whole request becomes every item's error."""
        try:
            body = self._post({"texts": texts})
        except BertServeError as error:
            if error.code in REQUEST_WIDE_CODES:
                raise
            return [ItemResult(error=ItemError(error.code, error.message))] * len(texts)
        results = body.get("results")
        if not isinstance(results, list) or len(results) != len(texts):
            raise BertServeError(
                "bad_response", f"expected {len(texts)} results, got {body!r:.200}"
            )
        return [_item_result(entry) for entry in results]

    def classify_iter(
        self,
        texts: Iterable[str],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        concurrency: int = DEFAULT_CONCURRENCY,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> Iterator[ItemResult]:
        """Results in input order as they arrive, with at most `concurrency` requests in flight.

        Reads `texts` lazily, so a large file never sits in memory whole.
        """
        if chunk_size < 1 or concurrency < 1:
            raise ValueError(
                f"chunk_size and concurrency must be >= 1, got {chunk_size} and {concurrency}"
            )
        chunks = chunk_texts(texts, chunk_size, max_request_bytes)
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bert-serve") as pool:
            pending: deque[Future[list[ItemResult]]] = deque()
            try:
                for chunk in chunks:
                    pending.append(pool.submit(self.classify_chunk, chunk))
                    if len(pending) >= concurrency:
                        yield from pending.popleft().result()
                while pending:
                    yield from pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()

    def classify_many(self, texts: Iterable[str], **options: Any) -> list[ItemResult]:
        """All results, in order; see `classify_iter` for the options."""
        return list(self.classify_iter(texts, **options))


def _json_object(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise BertServeError(
            "bad_response",
            f"expected a JSON object, got {response.text!r:.200}",
            response.status_code,
        )
    return body


def _item_result(entry: Any) -> ItemResult:
    if isinstance(entry, dict) and isinstance(entry.get("error"), dict):
        error = entry["error"]
        return ItemResult(error=ItemError(str(error.get("code")), str(error.get("message"))))
    return ItemResult(prediction=Prediction.from_json(entry))
