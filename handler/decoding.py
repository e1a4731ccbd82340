"""Stage 1: turn one raw TorchServe request into a valid text or a rejection.

What the worker receives for one request depends on how the client sent it:

- a plain body (``text/plain``, JSON, no Content-Type, ...) arrives as ``{"body": ...}``
  (``"data"`` on some paths); with ``decode_input_request=false`` in config.properties it
  is always raw bytes, otherwise TorchServe may hand over a ``str`` or already-parsed JSON;
- a form or multipart body is decoded by TorchServe's frontend into named fields; a bare
  form body without ``name=value`` pairs (what ``curl -d "some text"`` sends) arrives as
  no field at all, so the text is gone before the handler runs.

Nothing here raises for bad input: every outcome is a value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from handler.errors import ErrorCode

BODY_KEYS = ("body", "data")
TEXT_FIELD = "text"
TEXT_PAIR_FIELD = "text_pair"
TOP_K_OPTION = "top_k"
RAW_SCORES_OPTION = "raw_scores"
TEXTS_FIELD = "texts"
INSTANCES_FIELD = "instances"
# A list arrives as ours ({"texts": [...]}) or as KServe's v1 protocol ({"instances": [...]});
# the answer puts its entries under the key that goes with the request's.
LIST_ANSWER_KEYS = {TEXTS_FIELD: "results", INSTANCES_FIELD: "predictions"}
DEFAULT_MAX_TEXTS = 64
FORM_MEDIA_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


@dataclass(frozen=True)
class ScoreOptions:
    """Per-request choices, applied to each answer after the forward pass, so they never
    change which requests share a batch."""

    top_k: int | None = None
    """Keep only the k best labels in ``scores``, best first (None: every label, in order)."""
    raw_scores: bool = False
    """Answer the logits instead of the model's score function applied to them."""


DEFAULT_OPTIONS = ScoreOptions()


@dataclass(frozen=True)
class ValidText:
    """A text ready to classify, with its optional second text and its request's options."""

    text: str
    text_pair: str | None = None
    options: ScoreOptions = DEFAULT_OPTIONS


@dataclass(frozen=True)
class Rejected:
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class TextList:
    """A list request: each text validated on its own, in order; `field` is the list's key."""

    items: tuple[ValidText | Rejected, ...]
    field: str = TEXTS_FIELD


Decoded = ValidText | Rejected | TextList


def media_type(content_type: str | None) -> str:
    """``"Application/JSON; charset=utf-8"`` -> ``"application/json"``; None -> ``""``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_json(media: str) -> bool:
    return media == "application/json" or media.endswith("+json")


def decode_request(
    fields: Mapping[str, Any],
    content_type: str | None,
    max_chars: int,
    max_texts: int = DEFAULT_MAX_TEXTS,
) -> Decoded:
    """Find the text of one request and validate it."""
    media = media_type(content_type)
    for key in BODY_KEYS:
        if key in fields:
            return decode_body(fields[key], media, max_chars, max_texts)
    if TEXT_FIELD in fields:
        return _form_text(fields, max_chars)
    return Rejected(ErrorCode.MISSING_FIELD, _missing_text_message(media, sorted(fields)))


def _form_text(fields: Mapping[str, Any], max_chars: int) -> ValidText | Rejected:
    """Form fields: ``text``, and ``text_pair`` for a pair (options are read from JSON only)."""
    text = _checked_text(fields[TEXT_FIELD], max_chars)
    if isinstance(text, Rejected) or TEXT_PAIR_FIELD not in fields:
        return text
    pair = _checked_text(fields[TEXT_PAIR_FIELD], max_chars, TEXT_PAIR_FIELD)
    return pair if isinstance(pair, Rejected) else ValidText(text.text, pair.text)


def decode_body(
    body: Any, media: str, max_chars: int, max_texts: int = DEFAULT_MAX_TEXTS
) -> Decoded:
    """A whole request body: JSON when the Content-Type says so, else UTF-8 text."""
    if isinstance(body, bytes | bytearray):
        if not is_json(media):
            return _checked_text(body, max_chars)
        text = _utf8(body)
        if isinstance(text, Rejected):
            return text
        try:
            body = json.loads(text)
        except (ValueError, RecursionError) as error:
            return Rejected(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {_short(error)}")
        return _text_from_json(body, max_chars, max_texts)
    if isinstance(body, str) and not is_json(media):
        return _checked_text(body, max_chars)
    return _text_from_json(body, max_chars, max_texts)


def _text_from_json(document: Any, max_chars: int, max_texts: int) -> Decoded:
    if not isinstance(document, dict):
        return Rejected(
            ErrorCode.INVALID_TYPE,
            f'the JSON body must be an object like {{"text": "..."}}, got {_json_type(document)}',
        )
    options = parse_options(document)
    if isinstance(options, Rejected):
        return options
    list_fields = [key for key in LIST_ANSWER_KEYS if key in document]
    if list_fields:
        return _text_list(document, list_fields, max_chars, max_texts, options)
    if TEXT_FIELD not in document:
        return Rejected(
            ErrorCode.MISSING_FIELD, 'the JSON object has no "text", "texts" or "instances" field'
        )
    text = document[TEXT_FIELD]
    if not isinstance(text, str):
        return Rejected(ErrorCode.INVALID_TYPE, f'"text" must be a string, got {_json_type(text)}')
    return _text_and_pair(text, document, f'"{TEXT_PAIR_FIELD}"', max_chars, options)


def parse_options(document: dict[str, Any]) -> ScoreOptions | Rejected:
    """``top_k`` and ``raw_scores`` next to the text(s); a key that is present must be valid."""
    top_k: Any = document.get(TOP_K_OPTION)
    if TOP_K_OPTION in document and not (_is_whole_number(top_k) and top_k >= 1):
        is_number = isinstance(top_k, int | float) and not isinstance(top_k, bool)
        shown = _short(top_k, 40) if is_number else _json_type(top_k)
        return Rejected(
            ErrorCode.INVALID_OPTION, f'"top_k" must be a whole number of at least 1, got {shown}'
        )
    raw_scores = document.get(RAW_SCORES_OPTION, False)
    if not isinstance(raw_scores, bool):
        return Rejected(
            ErrorCode.INVALID_OPTION,
            f'"raw_scores" must be true or false, got {_json_type(raw_scores)}',
        )
    if top_k is None and not raw_scores:
        return DEFAULT_OPTIONS
    return ScoreOptions(top_k=top_k, raw_scores=raw_scores)


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
                ErrorCode.INVALID_TYPE, f"{pair_name} must be a string, got {_json_type(pair)}"
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
    options: ScoreOptions = DEFAULT_OPTIONS,
) -> TextList | Rejected:
    """``{"texts": [...]}`` or ``{"instances": [...]}``: the list is checked as a whole, then
    each item on its own. An item is a string or an object ``{"text": "...", "text_pair": "..."}``;
    the request's options apply to every item."""
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
            ErrorCode.INVALID_TYPE,
            f'"{field}" must be an array of strings, got {_json_type(items)}',
        )
    if not items:
        return Rejected(ErrorCode.EMPTY_TEXT, f'"{field}" is an empty array')
    if len(items) > max_texts:
        return Rejected(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f'"{field}" has {len(items):,} items; the limit is {max_texts:,}',
        )
    return TextList(
        tuple(
            _list_item(item, f"{field}[{index}]", max_chars, options)
            for index, item in enumerate(items)
        ),
        field,
    )


def _list_item(
    item: Any, place: str, max_chars: int, options: ScoreOptions = DEFAULT_OPTIONS
) -> ValidText | Rejected:
    text = item.get(TEXT_FIELD) if isinstance(item, dict) else item
    if not isinstance(text, str):
        return Rejected(
            ErrorCode.INVALID_TYPE,
            f'{place} must be a string or {{"text": "..."}}, got {_json_type(item)}',
        )
    pair_source = item if isinstance(item, dict) else None
    return _text_and_pair(text, pair_source, f"{place}.{TEXT_PAIR_FIELD}", max_chars, options)


def _checked_text(value: Any, max_chars: int, name: str = TEXT_FIELD) -> ValidText | Rejected:
    """A form field or raw body: bytes are decoded as strict UTF-8."""
    if isinstance(value, bytes | bytearray):
        decoded = _utf8(value)
        if isinstance(decoded, Rejected):
            return decoded
        value = decoded
    if not isinstance(value, str):
        return Rejected(
            ErrorCode.INVALID_TYPE, f"the {name} must be a string, got {_json_type(value)}"
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


def _utf8(raw: bytes | bytearray) -> str | Rejected:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        return Rejected(
            ErrorCode.INVALID_ENCODING,
            f"the body is not valid UTF-8: byte 0x{raw[error.start]:02x} at offset {error.start}",
        )


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


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    kinds = ((bool, "a boolean"), (dict, "an object"), (list, "an array"), (str, "a string"))
    for kind, name in (*kinds, (int | float, "a number")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _short(value: object, limit: int = 120) -> str:
    message = str(value)
    return message if len(message) <= limit else message[: limit - 3] + "..."
