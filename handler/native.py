"""The handler's own protocol, with KServe v1's ``{"instances": [...]}``: one text answered
with its own status, or a list answered 200 with an entry per text (shapes: docs/api.md); on
the explanation routes the same bodies are explained."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from handler.protocol import (
    BODY_KEYS,
    TEXT_FIELD,
    WireProtocol,
    checked_text,
    is_explanation,
    is_json,
    json_type,
    media_type,
    parse_json,
    short,
    validate_text,
)
from handler.settings import HandlerSettings
from handler.values import (
    HTTP_STATUS,
    ErrorCode,
    ExplainOptions,
    Explanation,
    IncomingRequest,
    ItemOutcome,
    Prediction,
    Rejected,
    Response,
    ScoreOptions,
    ValidText,
    error_body,
)

TEXT_PAIR_FIELD = "text_pair"
TEXTS_FIELD = "texts"
INSTANCES_FIELD = "instances"
LIST_ANSWER_KEYS = {TEXTS_FIELD: "results", INSTANCES_FIELD: "predictions"}
"""Ours, and KServe v1's, whose ``:explain`` answers its instances under "explanations"."""
FORM_MEDIA_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
DEFAULT_OPTIONS = ScoreOptions()
OPTION_FIELDS = ("top_k", "raw_scores", "windows")
ITEM_FIELDS = (TEXT_FIELD, TEXT_PAIR_FIELD)
TEXT_FIELDS = (TEXT_FIELD, TEXTS_FIELD, INSTANCES_FIELD)
FIELDS = (*ITEM_FIELDS, TEXTS_FIELD, INSTANCES_FIELD, *OPTION_FIELDS, "target", "n_steps")
"""What a JSON body may hold, on both routes (a prediction ignores the explanation's options)."""


@dataclass(frozen=True)
class TextList:
    """A list request: each text validated on its own, in order; `field` is the list's key."""

    items: tuple[ValidText | Rejected, ...]
    field: str = TEXTS_FIELD
    explaining: bool = False

    @property
    def answer_key(self) -> str:
        if self.explaining and self.field == INSTANCES_FIELD:
            return "explanations"
        return LIST_ANSWER_KEYS[self.field]


NativeRequest = ValidText | TextList


class NativeProtocol:
    """Claims every request, so it is asked last."""

    def decode(
        self, request: IncomingRequest, settings: HandlerSettings
    ) -> NativeRequest | Rejected:
        return decode_request(
            request.fields,
            request.content_type,
            settings.max_chars,
            settings.max_texts_per_request,
            is_explanation(request.headers),
        )

    def render(
        self, decoded: NativeRequest, outcomes: tuple[ItemOutcome, ...], request_id: str
    ) -> Response:
        """A list answers 200 with an entry per text; one text answers its own status."""
        if isinstance(decoded, TextList):
            entries = [_list_entry(item) for item in outcomes]
            return _ok({decoded.answer_key: entries, "request_id": request_id})
        (outcome,) = outcomes
        if isinstance(outcome, Rejected):
            return self.refuse(outcome, request_id)
        return _ok({**outcome_fields(outcome), "request_id": request_id})

    def refuse(self, rejected: Rejected, request_id: str) -> Response:
        status, phrase = HTTP_STATUS[rejected.code]
        body = error_body(rejected.code, rejected.message, request_id)
        return Response(status, phrase, json.dumps(body))


PROTOCOL: WireProtocol[NativeRequest] = NativeProtocol()


def decode_request(
    fields: Mapping[str, Any],
    content_type: str | None,
    max_chars: int,
    max_texts: int,
    explaining: bool = False,
) -> NativeRequest | Rejected:
    """Find the text of one request and validate it; explaining, with its ``ExplainOptions``."""
    media = media_type(content_type)
    for key in BODY_KEYS:
        if key in fields:
            return decode_body(fields[key], media, max_chars, max_texts, explaining)
    if TEXT_FIELD in fields:
        return _explained(_form_text(fields, max_chars), explaining, ExplainOptions())
    return Rejected(ErrorCode.MISSING_FIELD, _missing_text_message(media, sorted(fields)))


def _explained(
    decoded: NativeRequest | Rejected, explaining: bool, options: ExplainOptions
) -> NativeRequest | Rejected:
    """The decoded request with ``options`` on each valid text when it is an explanation."""
    if not explaining or isinstance(decoded, Rejected):
        return decoded
    marked = _on_each_text(decoded, explain=options)
    return replace(marked, explaining=True) if isinstance(marked, TextList) else marked


def _on_each_text(decoded: NativeRequest, **changes: Any) -> NativeRequest:
    """The decoded request with ``changes`` made to each of its valid texts."""
    if isinstance(decoded, ValidText):
        return replace(decoded, **changes)
    items = tuple(
        replace(item, **changes) if isinstance(item, ValidText) else item for item in decoded.items
    )
    return replace(decoded, items=items)


def _form_text(fields: Mapping[str, Any], max_chars: int) -> ValidText | Rejected:
    """Form fields: ``text``, and ``text_pair`` for a pair (options are read from JSON only)."""
    text = checked_text(fields[TEXT_FIELD], max_chars)
    if isinstance(text, Rejected) or TEXT_PAIR_FIELD not in fields:
        return text
    pair = checked_text(fields[TEXT_PAIR_FIELD], max_chars, TEXT_PAIR_FIELD)
    return pair if isinstance(pair, Rejected) else ValidText(text.text, pair.text)


def decode_body(
    body: Any, media: str, max_chars: int, max_texts: int, explaining: bool = False
) -> NativeRequest | Rejected:
    """A whole request body: JSON when the Content-Type says so, else UTF-8 text."""
    if isinstance(body, bytes | bytearray | str) and not is_json(media):
        return _explained(checked_text(body, max_chars), explaining, ExplainOptions())
    if isinstance(body, bytes | bytearray):
        body = parse_json(body)
        if isinstance(body, Rejected):
            return body
    if isinstance(body, dict) and not body.keys().isdisjoint(TEXT_FIELDS):
        unknown = unknown_fields(body, FIELDS)
        if unknown is not None:
            return unknown
    return _text_from_json(body, max_chars, max_texts, explaining)


def unknown_fields(document: Mapping[str, Any], known: tuple[str, ...]) -> Rejected | None:
    """A field the API does not read is refused, not ignored: a typo such as "topk" would
    otherwise answer 200 without the option it meant. (A body with no text field at all
    answers ``missing_field`` instead.)"""
    unknown = sorted(set(document) - set(known))
    if not unknown:
        return None
    names = ", ".join(f'"{name}"' for name in unknown[:5])
    expected = ", ".join(f'"{name}"' for name in known)
    return Rejected(
        ErrorCode.INVALID_OPTION,
        f"unknown field {short(names, 80)}; the fields read are {expected}",
    )


def _text_from_json(
    document: Any, max_chars: int, max_texts: int, explaining: bool = False
) -> NativeRequest | Rejected:
    if not isinstance(document, dict):
        return Rejected(
            ErrorCode.INVALID_TYPE,
            f'the JSON body must be an object like {{"text": "..."}}, got {json_type(document)}',
        )
    options = parse_options(document)
    if isinstance(options, Rejected):
        return options
    windows = document.get("windows")
    if windows is not None and not isinstance(windows, bool):
        return Rejected(
            ErrorCode.INVALID_OPTION, f'"windows" must be true or false, got {json_type(windows)}'
        )
    if windows is not None:
        decoded = _text_from_json(
            {k: v for k, v in document.items() if k != "windows"}, max_chars, max_texts, explaining
        )
        return decoded if isinstance(decoded, Rejected) else _on_each_text(decoded, windows=windows)
    if explaining:
        explain_options = parse_explain_options(document)
        if isinstance(explain_options, Rejected):
            return explain_options
        decoded = _text_from_json(document, max_chars, max_texts)
        return _explained(decoded, explaining, explain_options)
    list_fields = [key for key in LIST_ANSWER_KEYS if key in document]
    if list_fields:
        return _text_list(document, list_fields, max_chars, max_texts, options)
    if TEXT_FIELD not in document:
        return Rejected(
            ErrorCode.MISSING_FIELD, 'the JSON object has no "text", "texts" or "instances" field'
        )
    text = document[TEXT_FIELD]
    if not isinstance(text, str):
        return Rejected(ErrorCode.INVALID_TYPE, f'"text" must be a string, got {json_type(text)}')
    return _text_and_pair(text, document, f'"{TEXT_PAIR_FIELD}"', max_chars, options)


def parse_options(document: dict[str, Any]) -> ScoreOptions | Rejected:
    """``top_k`` and ``raw_scores`` next to the text(s); a key that is present must be valid."""
    top_k: Any = document.get("top_k")
    if "top_k" in document and not (_is_whole_number(top_k) and top_k >= 1):
        is_number = isinstance(top_k, int | float) and not isinstance(top_k, bool)
        shown = short(top_k, 40) if is_number else json_type(top_k)
        return Rejected(
            ErrorCode.INVALID_OPTION, f'"top_k" must be a whole number of at least 1, got {shown}'
        )
    raw_scores = document.get("raw_scores", False)
    if not isinstance(raw_scores, bool):
        return Rejected(
            ErrorCode.INVALID_OPTION,
            f'"raw_scores" must be true or false, got {json_type(raw_scores)}',
        )
    if top_k is None and not raw_scores:
        return DEFAULT_OPTIONS
    return ScoreOptions(top_k=top_k, raw_scores=raw_scores)


def parse_explain_options(document: dict[str, Any]) -> ExplainOptions | Rejected:
    """``target`` and ``n_steps``; the cap on steps is the worker's (``explain``)."""
    target = document.get("target")
    if target is not None and not (isinstance(target, str) or _is_whole_number(target)):
        return Rejected(
            ErrorCode.INVALID_OPTION,
            f'"target" must be a label or a class index, got {json_type(target)}',
        )
    steps = document.get("n_steps")
    if steps is not None and not (_is_whole_number(steps) and steps >= 1):
        shown = short(steps, 40) if isinstance(steps, int | float) else json_type(steps)
        return Rejected(
            ErrorCode.INVALID_OPTION, f'"n_steps" must be a whole number of at least 1, got {shown}'
        )
    return ExplainOptions(target=target, n_steps=steps)


def _text_and_pair(
    text: str,
    source: Mapping[str, Any] | None,
    pair_name: str,
    max_chars: int,
    options: ScoreOptions,
) -> ValidText | Rejected:
    """A text, and its second text when ``source`` has ``text_pair`` (it must then be valid)."""
    valid = validate_text(text, max_chars)
    if isinstance(valid, Rejected):
        return valid
    pair = None
    if source is not None and TEXT_PAIR_FIELD in source:
        pair = source[TEXT_PAIR_FIELD]
        if not isinstance(pair, str):
            return Rejected(
                ErrorCode.INVALID_TYPE, f"{pair_name} must be a string, got {json_type(pair)}"
            )
        valid_pair = validate_text(pair, max_chars, TEXT_PAIR_FIELD)
        if isinstance(valid_pair, Rejected):
            return valid_pair
    return ValidText(text, pair, options)


def _text_list(
    document: dict[str, Any],
    list_fields: list[str],
    max_chars: int,
    max_texts: int,
    options: ScoreOptions,
) -> TextList | Rejected:
    """``{"texts": [...]}`` or ``{"instances": [...]}``: the list as a whole, then each item."""
    if len(list_fields) > 1 or TEXT_FIELD in document:
        return Rejected(ErrorCode.INVALID_TYPE, 'send one of "text", "texts" or "instances"')
    if TEXT_PAIR_FIELD in document:
        return Rejected(
            ErrorCode.INVALID_TYPE,
            '"text_pair" goes next to "text", or inside each item of a list: '
            '{"texts": [{"text": "...", "text_pair": "..."}]}',
        )
    (field,) = list_fields
    items = document[field]
    if not isinstance(items, list):
        return Rejected(
            ErrorCode.INVALID_TYPE, f'"{field}" must be an array of strings, got {json_type(items)}'
        )
    if not items:
        return Rejected(ErrorCode.EMPTY_TEXT, f'"{field}" is an empty array')
    if len(items) > max_texts:
        return Rejected(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f'"{field}" has {len(items):,} items; the limit is {max_texts:,}',
        )
    checked = (
        _list_item(item, f"{field}[{index}]", max_chars, options, field == TEXTS_FIELD)
        for index, item in enumerate(items)
    )
    return TextList(tuple(checked), field)


def _list_item(
    item: Any, place: str, max_chars: int, options: ScoreOptions, only_ours: bool
) -> ValidText | Rejected:
    """One item of a list; ``only_ours``: an object with fields we do not read is refused (KServe
    v1's instances may carry fields of the caller's own, as KServe allows)."""
    text = item.get(TEXT_FIELD) if isinstance(item, dict) else item
    if not isinstance(text, str):
        return Rejected(
            ErrorCode.INVALID_TYPE,
            f'{place} must be a string or {{"text": "..."}}, got {json_type(item)}',
        )
    pair_source = item if isinstance(item, dict) else None
    if pair_source is not None and only_ours:
        unknown = unknown_fields(pair_source, ITEM_FIELDS)
        if unknown is not None:
            return Rejected(unknown.code, f"{place}: {unknown.message}")
    return _text_and_pair(text, pair_source, f"{place}.{TEXT_PAIR_FIELD}", max_chars, options)


def _missing_text_message(media: str, field_names: list[str]) -> str:
    if media in FORM_MEDIA_TYPES:
        return (
            f'the form has no "text" field (fields: {field_names[:10]}). TorchServe decodes '
            f"{media} bodies into fields and drops a bare text, which is what `curl -d` "
            "sends; send the text as a field (curl --data-urlencode 'text=...'), as "
            'Content-Type: text/plain, or as JSON {"text": "..."}'
        )
    return 'the request has no body and no "text" field'


def _is_whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def outcome_fields(outcome: Prediction | Explanation) -> dict[str, Any]:
    """An explanation's every field, in order; a prediction's label, score, scores, truncated,
    labels for multi-label models, and windows for a text classified as more than one."""
    if isinstance(outcome, Explanation):
        return asdict(outcome)
    fields: dict[str, Any] = {
        "label": outcome.label,
        "score": outcome.score,
        "scores": outcome.scores,
        "truncated": outcome.truncated,
    }
    if outcome.labels is not None:
        fields["labels"] = outcome.labels
    if outcome.windows is not None:
        fields["windows"] = outcome.windows
    return fields


def _list_entry(item: ItemOutcome) -> dict[str, Any]:
    if isinstance(item, Rejected):
        return {"error": {"code": item.code.value, "message": item.message}}
    return outcome_fields(item)


def _ok(body: dict[str, Any]) -> Response:
    return Response(200, "OK", json.dumps(body))
