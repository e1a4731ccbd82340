"""What every wire protocol shares: the request as delivered, the values, and ``WireProtocol``,
the interface each protocol module implements (after LitServe's ``LitSpec`` hooks; the method
table: docs/handler.md). ``handler.pipeline.PROTOCOLS`` lists them in the order they are asked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from handler.settings import HandlerSettings
from handler.values import (
    IncomingRequest,
    ItemOutcome,
    Rejected,
    Response,
    Texts,
)

# TorchServe adds url_path to /predictions requests only, and explain to those and KServe's.
PREDICTIONS_ROUTE_HEADER = "url_path"
KSERVE_ROUTE_HEADER = "explain"
JSON_MEDIA = "application/json"


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
