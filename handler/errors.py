"""The one table of per-item errors: code, HTTP status, reason phrase.

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

from enum import StrEnum
from typing import Any


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
