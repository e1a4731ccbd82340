"""What every wire protocol shares: ``WireProtocol``, the interface each protocol module
implements (after LitServe's ``LitSpec`` hooks; the method table: docs/handler.md), the route
headers, and the checks each applies to a body: media types, strict UTF-8, and one text's
rules. ``handler.pipeline.PROTOCOLS`` lists the protocols in the order they are asked.

A plain body arrives as ``{"body": ...}`` (``"data"`` on some paths), a form body as named
fields. Nothing here raises for bad input: every outcome is a value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from handler.settings import HandlerSettings
from handler.values import (
    ErrorCode,
    IncomingRequest,
    ItemOutcome,
    Rejected,
    Response,
    Texts,
    ValidText,
)

# TorchServe adds url_path to /predictions requests only, and explain to those and KServe's.
PREDICTIONS_ROUTE_HEADER = "url_path"
KSERVE_ROUTE_HEADER = "explain"
JSON_MEDIA = "application/json"
BODY_KEYS = ("body", "data")
TEXT_FIELD = "text"


T = TypeVar("T", bound=Texts)


class WireProtocol(Protocol[T]):
    """One wire format; ``T`` is its own value for a decoded request (it has the ``items``)."""

    def decode(self, request: IncomingRequest, settings: HandlerSettings) -> T | Rejected | None:
        """The request's texts, or its refusal; None when the request is not in this protocol."""

    def render(self, decoded: T, outcomes: tuple[ItemOutcome, ...], request_id: str) -> Response:
        """The answer: ``outcomes`` has one prediction or error per item of ``decoded``."""

    def refuse(self, rejected: Rejected, request_id: str) -> Response:
        """The answer to a request refused as a whole."""


def header_value(headers: Mapping[str, Any], name: str) -> str | None:
    """Case-insensitive header lookup; TorchServe keeps the client's spelling."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted and isinstance(value, str):
            return value
    return None


def is_explanation(headers: Mapping[str, Any]) -> bool:
    """``/explanations/{model}`` and KServe's ``:explain`` routes: TorchServe sets ``explain``
    to ``True`` on them and to ``False`` on the prediction routes, after the client's own
    headers, in a map whose keys are case-sensitive; so the exact key is read, and a client's
    ``explain: True`` sent to ``/predictions`` is overwritten."""
    return headers.get(KSERVE_ROUTE_HEADER) == "True"


def is_kserve_route(headers: Mapping[str, Any]) -> bool:
    """KServe's v1 ``:predict`` and v2 ``/infer`` routes, told apart from ``/predictions``."""
    return (
        header_value(headers, KSERVE_ROUTE_HEADER) is not None
        and header_value(headers, PREDICTIONS_ROUTE_HEADER) is None
    )


def route_content_type(headers: Mapping[str, Any], content_type: str | None) -> str | None:
    """JSON when a KServe route's request has no Content-Type (tritonclient sends none)."""
    if content_type is None and is_kserve_route(headers):
        return JSON_MEDIA
    return content_type


def media_type(content_type: str | None) -> str:
    """``"Application/JSON; charset=utf-8"`` -> ``"application/json"``; None -> ``""``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


JSON_MEDIA_TYPES = (JSON_MEDIA, "text/json")
BOM = "\ufeff"


def is_json(media: str) -> bool:
    """JSON's media type, its old ``text/json`` and any ``+json`` suffix."""
    return media in JSON_MEDIA_TYPES or media.endswith("+json")


def parse_json(body: bytes | bytearray | str) -> Any | Rejected:
    """A JSON body as strict UTF-8, one leading byte order mark allowed (RFC 8259 lets a
    parser ignore it; Windows tools write one)."""
    text = body if isinstance(body, str) else utf8(body)
    if isinstance(text, Rejected):
        return text
    try:
        return json.loads(text.removeprefix(BOM))
    except (ValueError, RecursionError) as error:
        return Rejected(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {short(error)}")


def checked_text(value: Any, max_chars: int, name: str = TEXT_FIELD) -> ValidText | Rejected:
    """A form field or raw body: bytes are decoded as strict UTF-8."""
    if isinstance(value, bytes | bytearray):
        value = utf8(value)
        if isinstance(value, Rejected):
            return value
    if not isinstance(value, str):
        return Rejected(
            ErrorCode.INVALID_TYPE, f"the {name} must be a string, got {json_type(value)}"
        )
    return validate_text(value, max_chars, name)


def validate_text(text: str, max_chars: int, name: str = TEXT_FIELD) -> ValidText | Rejected:
    """One text (or the ``text_pair`` of a pair, by ``name``) against the per-text rules."""
    if len(text) > max_chars:
        return Rejected(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"{name} has {len(text):,} characters; the limit is {max_chars:,}",
        )
    if not text.strip():
        return Rejected(ErrorCode.EMPTY_TEXT, f"{name} is empty or only white space")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return Rejected(
            ErrorCode.INVALID_ENCODING,
            f"{name} has a lone surrogate (U+{ord(text[error.start]):04X}) at character "
            f"{error.start}, which is not valid Unicode",
        )
    return ValidText(text)


def utf8(raw: bytes | bytearray) -> str | Rejected:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        return Rejected(
            ErrorCode.INVALID_ENCODING,
            f"the body is not valid UTF-8: byte 0x{raw[error.start]:02x} at offset {error.start}",
        )


def json_type(value: Any) -> str:
    """How an error message names a JSON value's type: "an object", "a number", ..."""
    if value is None:
        return "null"
    kinds = ((bool, "a boolean"), (dict, "an object"), (list, "an array"), (str, "a string"))
    for kind, name in (*kinds, (int | float, "a number")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def short(value: object, limit: int = 120) -> str:
    message = str(value)
    return message if len(message) <= limit else message[: limit - 3] + "..."
