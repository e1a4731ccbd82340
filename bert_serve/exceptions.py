"""Every error the client raises, one class per way a call can fail.

    BertServeError                 any failure; .code, .message, .status, .request_id
    ├── TransportError             no HTTP answer came back
    │   ├── ConnectError           connection_failed: refused or reset, after the retries
    │   ├── Timeout                timeout: no answer within `timeout`, on every attempt
    │   └── RequestFailed          request_failed: could not be sent (say, a malformed URL)
    ├── ServerError                TorchServe answered with an error of its own
    │   ├── Unauthorized           unauthorized: a missing or wrong token (400, 401, 403)
    │   ├── ModelNotFound          model_not_found: no such model (404)
    │   ├── BodyTooLarge           payload_too_large: the body is over max_request_size (413)
    │   ├── Unavailable            unavailable: the queue is full (503) or 429, after the retries
    │   ├── WorkerDied             worker_died: "Worker died." (any status) or 507, after the retries
    │   └── UnexpectedStatus       http_<status>: any other answer TorchServe gives
    ├── Rejected                   the handler refused the text; .code is an ErrorCode
    │   ├── InvalidText            400: empty_text, missing_field, invalid_type, invalid_json,
    │   │                               invalid_encoding, invalid_option
    │   │                               not_explainable
    │   ├── TextTooLong            413: payload_too_large (over max_chars, or too many texts),
    │   │                               explain_too_long (over explain_max_tokens)
    │   ├── ModelFailed            500: internal_error (the model failed on this batch or text)
    │   └── DeadlineExceeded       504: deadline_exceeded (it waited past its deadline), after
    │                                   the retries
    ├── BadResponse                bad_response: a 200 that is not the JSON the API promises
    └── InvalidKeyFile             invalid_key_file: no inference key in the key file

The codes of `Rejected` mirror the server's one error table, `handler/values.py`
(`ErrorCode` and `HTTP_STATUS` there; `docs/api.md` lists them). They are copied, not
imported, because the client installs without the server; a unit test keeps the two equal.
A code this client does not know (a newer server) still raises `Rejected`, with the code as
the server sent it.

`Unavailable`, `WorkerDied` and `DeadlineExceeded` are the answers the client retries (with connection errors and
attempts with no answer); they reach the caller only once the retries are spent.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    """The handler's per-item error codes (handler/values.py `ErrorCode`). A `str` as
    `enum.StrEnum` is, which the client cannot use: it supports Python 3.9."""

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

    def __str__(self) -> str:
        return str(self.value)


# The status the server answers each code with (handler/values.py `HTTP_STATUS`).
ERROR_STATUS: dict[ErrorCode, int] = {
    ErrorCode.EMPTY_TEXT: 400,
    ErrorCode.MISSING_FIELD: 400,
    ErrorCode.INVALID_TYPE: 400,
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.INVALID_ENCODING: 400,
    ErrorCode.INVALID_OPTION: 400,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.EXPLAIN_TOO_LONG: 413,
    ErrorCode.NOT_EXPLAINABLE: 400,
    ErrorCode.INTERNAL_ERROR: 500,
    ErrorCode.DEADLINE_EXCEEDED: 504,
}


class BertServeError(Exception):
    """A call failed. `code` names the failure: the server's error code, or the class's own."""

    code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
    ):
        if code is not None:
            self.code = code
        super().__init__(f"{self.code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.message = message
        self.status = status
        self.request_id = request_id


class TransportError(BertServeError):
    """No HTTP answer came back."""


class ConnectError(TransportError):
    code = "connection_failed"


class Timeout(TransportError):
    code = "timeout"


class RequestFailed(TransportError):
    code = "request_failed"


class ServerError(BertServeError):
    """TorchServe answered with an error of its own, before or around the handler."""


class Unauthorized(ServerError):
    code = "unauthorized"


class ModelNotFound(ServerError):
    code = "model_not_found"


class BodyTooLarge(ServerError):
    code = "payload_too_large"


class Unavailable(ServerError):
    code = "unavailable"


class WorkerDied(ServerError):
    code = "worker_died"


class UnexpectedStatus(ServerError):
    """Any other error status; `code` is http_<status>."""


class Rejected(BertServeError):
    """The handler refused the text; `code` is one of `ErrorCode` (or a code newer than it)."""


class InvalidText(Rejected):
    pass


class TextTooLong(Rejected):
    pass


class ModelFailed(Rejected):
    pass


class DeadlineExceeded(Rejected):
    pass


class BadResponse(BertServeError):
    code = "bad_response"


class InvalidKeyFile(BertServeError):
    code = "invalid_key_file"


REJECTED_BY_STATUS: dict[int, type[Rejected]] = {
    400: InvalidText,
    413: TextTooLong,
    500: ModelFailed,
    504: DeadlineExceeded,
}


def rejected(
    code: str, message: str, status: int | None = None, request_id: str | None = None
) -> Rejected:
    """The handler's error as its class, chosen by the code's status in the error table."""
    try:
        known = ErrorCode(code)
    except ValueError:
        return Rejected(message, code=code, status=status, request_id=request_id)
    cls = REJECTED_BY_STATUS[ERROR_STATUS[known]]
    return cls(message, code=known, status=status, request_id=request_id)
