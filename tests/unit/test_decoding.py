"""Unit tests for handler.native and the checks of handler.protocol: every way one request
becomes a text or a rejection."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handler.native import decode_body, decode_request
from handler.protocol import validate_text
from handler.settings import HandlerSettings
from handler.values import ErrorCode, Rejected, ValidText

LIMIT = 20
MAX_TEXTS = HandlerSettings().max_texts_per_request

WHITESPACE_ONLY = ["", " ", "   ", "\n", "\t", "\r\n", "\xa0", "\u2003", "\u3000\n\t"]

# (bad sequence, first bad byte): each is invalid UTF-8 wherever it appears.
BAD_UTF8 = [
    pytest.param(b"\xff\xfe", 0xFF, id="ff-fe"),
    pytest.param(b"\x80", 0x80, id="lone-continuation"),
    pytest.param(b"\xc0\xaf", 0xC0, id="overlong-2-byte"),
    pytest.param(b"\xe0\x80\xaf", 0xE0, id="overlong-3-byte"),
    pytest.param(b"\xed\xa0\x80", 0xED, id="encoded-surrogate"),
    pytest.param(b"\xe2\x82", 0xE2, id="truncated-sequence"),
]

JSON_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "Application/JSON",
    "application/vnd.api+json",
    " application/json ;charset=UTF-8",
    "text/json",
]
RAW_TYPES = ["text/plain", "text/plain; charset=utf-8", None, "", "application/octet-stream"]
FORM_TYPES = ["application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz"]


def json_body(document: Any) -> bytes:
    return json.dumps(document).encode("utf-8")


def assert_rejected(result: object, code: ErrorCode) -> Rejected:
    assert isinstance(result, Rejected), result
    assert result.code is code, result
    return result


# --- valid text -----------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", JSON_TYPES)
def test_json_content_types_parse_the_body(content_type: str) -> None:
    """Every spelling of a JSON media type parses the body and takes its "text"."""
    result = decode_request(
        {"body": json_body({"text": "great film"})}, content_type, LIMIT, MAX_TEXTS
    )
    assert result == ValidText("great film")


@pytest.mark.parametrize("content_type", RAW_TYPES)
def test_raw_content_types_take_the_body_as_text(content_type: str | None) -> None:
    """text/plain, no Content-Type and octet-stream treat the body as the UTF-8 text itself."""
    assert decode_request({"body": b"great film"}, content_type, LIMIT, MAX_TEXTS) == ValidText(
        "great film"
    )


@pytest.mark.parametrize("content_type", RAW_TYPES)
def test_json_looking_body_sent_as_raw_text_is_literal_text(content_type: str | None) -> None:
    """A JSON document sent as text/plain is classified as that literal text, not parsed."""
    body = '{"text": "hi"}'
    assert decode_request({"body": body.encode()}, content_type, LIMIT, MAX_TEXTS) == ValidText(
        body
    )


@pytest.mark.parametrize("key", ["body", "data"])
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        pytest.param(b"good movie", "text/plain", id="bytes-raw"),
        pytest.param(bytearray(b"good movie"), "text/plain", id="bytearray-raw"),
        pytest.param("good movie", "text/plain", id="str-raw"),
        pytest.param(b'{"text": "good movie"}', "application/json", id="bytes-json"),
        pytest.param(bytearray(b'{"text": "good movie"}'), "application/json", id="bytearray-json"),
        pytest.param({"text": "good movie"}, "application/json", id="pre-parsed-dict"),
    ],
)
def test_body_forms_and_keys(key: str, body: Any, content_type: str) -> None:
    """bytes, bytearray, str and a pre-parsed dict all work, under "body" and under "data"."""
    assert decode_request({key: body}, content_type, LIMIT, MAX_TEXTS) == ValidText("good movie")


def test_body_key_wins_over_a_text_field() -> None:
    """When both a body and a "text" field are present, the body is the request."""
    result = decode_request(
        {"body": b"from body", "text": b"from field"}, "text/plain", LIMIT, MAX_TEXTS
    )
    assert result == ValidText("from body")


@pytest.mark.parametrize("value", [b"nice", bytearray(b"nice"), "nice"])
@pytest.mark.parametrize("content_type", [*FORM_TYPES, None])
def test_form_text_field(value: Any, content_type: str | None) -> None:
    """A form field named "text" (bytes, bytearray or str) is the text."""
    assert decode_request({"text": value}, content_type, LIMIT, MAX_TEXTS) == ValidText("nice")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("😀 great", id="emoji"),
        pytest.param("很好的电影", id="cjk"),
        pytest.param("café crème brûlée", id="accents"),
        pytest.param("Ωμέγα — “quotes”", id="greek-punctuation"),
    ],
)
@pytest.mark.parametrize("encoding", ["raw", "json", "json-ascii-escaped"])
def test_non_ascii_text_is_valid(text: str, encoding: str) -> None:
    """Non-ASCII text survives raw bodies and JSON (literal or \\u-escaped) unchanged."""
    if encoding == "raw":
        body, content_type = text.encode("utf-8"), "text/plain"
    else:
        dumped = json.dumps({"text": text}, ensure_ascii=(encoding == "json-ascii-escaped"))
        body, content_type = dumped.encode("utf-8"), "application/json"
    assert decode_request({"body": body}, content_type, LIMIT, MAX_TEXTS) == ValidText(text)


def test_text_is_returned_unstripped() -> None:
    """Surrounding white space is kept: validation must not alter what the model sees."""
    assert validate_text("  hi \n", LIMIT) == ValidText("  hi \n")


# --- empty text -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", WHITESPACE_ONLY)
def test_validate_text_rejects_empty_and_whitespace(text: str) -> None:
    """Empty and white-space-only text (Unicode white space included) is empty_text."""
    result = assert_rejected(validate_text(text, LIMIT), ErrorCode.EMPTY_TEXT)
    assert "empty" in result.message


@pytest.mark.parametrize("text", WHITESPACE_ONLY)
@pytest.mark.parametrize(
    ("make_fields", "content_type"),
    [
        pytest.param(lambda t: {"body": t.encode()}, "text/plain", id="raw-bytes"),
        pytest.param(lambda t: {"body": t.encode()}, None, id="no-content-type"),
        pytest.param(lambda t: {"body": t}, "text/plain", id="raw-str"),
        pytest.param(lambda t: {"body": json_body({"text": t})}, "application/json", id="json"),
        pytest.param(lambda t: {"body": {"text": t}}, "application/json", id="pre-parsed"),
        pytest.param(lambda t: {"text": t.encode()}, FORM_TYPES[0], id="form-field"),
    ],
)
def test_empty_text_on_every_path(text: str, make_fields: Any, content_type: str | None) -> None:
    """Every way of sending a blank text ends as empty_text."""
    assert_rejected(
        decode_request(make_fields(text), content_type, LIMIT, MAX_TEXTS), ErrorCode.EMPTY_TEXT
    )


# --- length limit ---------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["a", "é", "😀", "中"])
def test_exactly_max_chars_is_valid(char: str) -> None:
    """A text of exactly max_chars characters passes, however many bytes it takes."""
    text = char * LIMIT
    assert decode_request({"body": text.encode()}, "text/plain", LIMIT, MAX_TEXTS) == ValidText(
        text
    )
    assert decode_request(
        {"body": json_body({"text": text})}, "application/json", LIMIT, MAX_TEXTS
    ) == (ValidText(text))


@pytest.mark.parametrize("char", ["a", "é", "😀", "中"])
def test_one_over_max_chars_is_too_large(char: str) -> None:
    """max_chars + 1 characters is payload_too_large, and the message names both numbers."""
    result = decode_request({"body": (char * (LIMIT + 1)).encode()}, "text/plain", LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.PAYLOAD_TOO_LARGE).message
    assert str(LIMIT + 1) in message
    assert str(LIMIT) in message


def test_too_large_message_with_default_sized_limit() -> None:
    """With a five-digit limit the message still shows the size and the limit."""
    result = validate_text("x" * 10_001, 10_000)
    message = assert_rejected(result, ErrorCode.PAYLOAD_TOO_LARGE).message
    assert "10,001" in message
    assert "10,000" in message


def test_length_counts_characters_not_bytes() -> None:
    """4-byte emoji count as one character each: 5 emoji (20 bytes) fit a limit of 5."""
    assert validate_text("😀" * 5, 5) == ValidText("😀" * 5)
    assert_rejected(validate_text("😀" * 6, 5), ErrorCode.PAYLOAD_TOO_LARGE)


@pytest.mark.parametrize(
    ("fields", "content_type"),
    [
        pytest.param(
            {"body": json_body({"text": "y" * (LIMIT + 1)})}, "application/json", id="json"
        ),
        pytest.param({"text": b"y" * (LIMIT + 1)}, FORM_TYPES[0], id="form-field"),
        pytest.param({"data": "y" * (LIMIT + 1)}, "text/plain", id="data-str"),
    ],
)
def test_too_large_on_other_paths(fields: dict[str, Any], content_type: str) -> None:
    """The length limit applies to JSON bodies, form fields and str bodies alike."""
    assert_rejected(
        decode_request(fields, content_type, LIMIT, MAX_TEXTS), ErrorCode.PAYLOAD_TOO_LARGE
    )


# --- missing field --------------------------------------------------------------------------


@pytest.mark.parametrize("document", [{}, {"txt": "hi"}, {"TEXT": "hi"}, {"data": {"text": "hi"}}])
def test_json_object_without_text_is_missing_field(document: dict[str, Any]) -> None:
    """A JSON object without an exact "text" key is missing_field, naming the field."""
    result = decode_request({"body": json_body(document)}, "application/json", LIMIT, MAX_TEXTS)
    assert '"text"' in assert_rejected(result, ErrorCode.MISSING_FIELD).message


@pytest.mark.parametrize("content_type", FORM_TYPES)
@pytest.mark.parametrize("fields", [{}, {"comment": b"hi"}])
def test_form_without_text_is_missing_field_and_mentions_curl(
    content_type: str, fields: dict[str, Any]
) -> None:
    """A form with no "text" field explains the `curl -d` pitfall and how to fix it."""
    message = assert_rejected(
        decode_request(fields, content_type, LIMIT, MAX_TEXTS), ErrorCode.MISSING_FIELD
    ).message
    assert "curl" in message
    assert "text/plain" in message
    for name in fields:
        assert name in message


@pytest.mark.parametrize("content_type", [None, "", "text/plain", "application/json"])
def test_no_body_and_no_fields_is_missing_field(content_type: str | None) -> None:
    """A request with nothing in it is missing_field."""
    result = decode_request({}, content_type, LIMIT, MAX_TEXTS)
    assert "text" in assert_rejected(result, ErrorCode.MISSING_FIELD).message


# --- invalid type ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (42, "a number"),
        (4.5, "a number"),
        (True, "a boolean"),
        (False, "a boolean"),
        (None, "null"),
        (["hi"], "an array"),
        ({"text": "hi"}, "an object"),
    ],
)
@pytest.mark.parametrize("pre_parsed", [False, True])
def test_text_of_wrong_type_is_invalid_type(value: Any, type_name: str, pre_parsed: bool) -> None:
    """A non-string "text" is invalid_type, and the message names the JSON type it got."""
    body = {"text": value} if pre_parsed else json_body({"text": value})
    result = decode_request({"body": body}, "application/json", LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.INVALID_TYPE).message
    assert type_name in message
    assert '"text"' in message


@pytest.mark.parametrize(
    ("document", "type_name"),
    [
        (["hi"], "an array"),
        ([], "an array"),
        ("hi", "a string"),
        (7, "a number"),
        (None, "null"),
        (True, "a boolean"),
    ],
)
@pytest.mark.parametrize("pre_parsed", [False, True])
def test_json_body_that_is_not_an_object_is_invalid_type(
    document: Any, type_name: str, pre_parsed: bool
) -> None:
    """A JSON body must be an object; arrays, strings, numbers and null say what they are."""
    body = document if pre_parsed else json_body(document)
    result = decode_request({"body": body}, "application/json", LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.INVALID_TYPE).message
    assert type_name in message
    assert '{"text": "..."}' in message


@pytest.mark.parametrize(
    ("value", "type_name"), [(12, "a number"), (None, "null"), ([b"x"], "an array")]
)
def test_form_field_of_wrong_type_is_invalid_type(value: Any, type_name: str) -> None:
    """A "text" field that is neither bytes nor str is invalid_type naming its type."""
    result = decode_request({"text": value}, FORM_TYPES[0], LIMIT, MAX_TEXTS)
    assert type_name in assert_rejected(result, ErrorCode.INVALID_TYPE).message


# --- invalid JSON ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"   ", id="blank"),
        pytest.param(b"{text: 'hi'}", id="unquoted"),
        pytest.param(b'{"text": "hi",}', id="trailing-comma"),
        pytest.param(b'{"text": "hi"', id="truncated-object"),
        pytest.param(b'{"text": "h', id="truncated-string"),
        pytest.param(b'{"text": "hi"} extra', id="trailing-data"),
        pytest.param(b"not json at all", id="plain-words"),
        pytest.param(b"[" * 100_000, id="deep-arrays"),
        pytest.param(b'{"a":' * 100_000, id="deep-objects"),
    ],
)
def test_malformed_json_is_invalid_json(body: bytes) -> None:
    """Malformed, truncated and absurdly nested JSON is invalid_json, never an exception."""
    result = decode_request({"body": body}, "application/json", LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.INVALID_JSON).message
    assert message.startswith("the body is not valid JSON")
    assert len(message) < 200


# --- invalid encoding -----------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "first_bad_byte"), BAD_UTF8)
@pytest.mark.parametrize("content_type", ["text/plain", None, "", "application/octet-stream"])
def test_invalid_utf8_raw_body(bad: bytes, first_bad_byte: int, content_type: str | None) -> None:
    """Bad UTF-8 in a raw body is invalid_encoding, naming the byte and its offset."""
    result = decode_request({"body": b"ok " + bad + b" end"}, content_type, LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.INVALID_ENCODING).message
    assert f"0x{first_bad_byte:02x}" in message
    assert "offset 3" in message


@pytest.mark.parametrize(("bad", "first_bad_byte"), BAD_UTF8)
def test_invalid_utf8_inside_json(bad: bytes, first_bad_byte: int) -> None:
    """Bad UTF-8 inside a JSON string is invalid_encoding (not invalid_json), with its offset."""
    body = b'{"text": "' + bad + b'"}'
    result = decode_request({"body": body}, "application/json", LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.INVALID_ENCODING).message
    assert f"0x{first_bad_byte:02x}" in message
    assert "offset 10" in message


@pytest.mark.parametrize(("bad", "first_bad_byte"), BAD_UTF8)
@pytest.mark.parametrize("wrap", [bytes, bytearray])
def test_invalid_utf8_form_field(bad: bytes, first_bad_byte: int, wrap: type) -> None:
    """Bad UTF-8 in a "text" form field is invalid_encoding, also for a bytearray."""
    result = decode_request({"text": wrap(bad)}, FORM_TYPES[1], LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.INVALID_ENCODING).message
    assert f"0x{first_bad_byte:02x} at offset 0" in message


def test_utf16_body_is_invalid_encoding() -> None:
    """A UTF-16 body (with BOM) is not silently accepted as text."""
    result = decode_request({"body": "hello".encode("utf-16")}, "text/plain", LIMIT, MAX_TEXTS)
    assert_rejected(result, ErrorCode.INVALID_ENCODING)


def test_json_escaped_surrogate_pair_is_valid() -> None:
    """A correctly paired \\ud83d\\ude00 escape decodes to one emoji."""
    result = decode_request(
        {"body": b'{"text": "\\ud83d\\ude00"}'}, "application/json", LIMIT, MAX_TEXTS
    )
    assert result == ValidText("😀")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"text": "ok \\ud800"}', id="lone-high"),
        pytest.param(b'{"text": "ok \\udc00"}', id="lone-low"),
        pytest.param(b'{"text": "\\ude00\\ud83d"}', id="reversed-pair"),
    ],
)
def test_json_escaped_lone_surrogate_is_rejected(body: bytes) -> None:
    """A lone surrogate smuggled in through a JSON escape is not valid text."""
    result = decode_request({"body": body}, "application/json", LIMIT, MAX_TEXTS)
    assert_rejected(result, ErrorCode.INVALID_ENCODING)


def test_a_byte_order_mark_before_json_is_ignored() -> None:
    """Windows tools write UTF-8 with a BOM; RFC 8259 lets a parser ignore it."""
    body = "\ufeff".encode() + json_body({"text": "great film"})
    assert decode_request({"body": body}, "application/json", LIMIT, MAX_TEXTS) == ValidText(
        "great film"
    )


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"text": "great film", "topk": 1}, '"topk"'),
        ({"texts": ["a"], "raw_score": True}, '"raw_score"'),
        ({"instances": ["a"], "top-k": 2, "x": 1}, '"top-k", "x"'),
    ],
)
def test_an_unknown_field_is_refused_by_name(document: dict[str, Any], named: str) -> None:
    """A typo of an option answers 400, not 200 without the option it meant."""
    result = decode_request({"body": json_body(document)}, "application/json", LIMIT, MAX_TEXTS)
    message = assert_rejected(result, ErrorCode.INVALID_OPTION).message
    assert named in message and '"top_k"' in message


def test_an_unknown_field_in_a_texts_item_refuses_that_item_alone() -> None:
    document = {"texts": ["a", {"text": "b", "top_k": 1}, {"text": "c", "text_pair": "d"}]}
    result = decode_request({"body": json_body(document)}, "application/json", LIMIT, MAX_TEXTS)
    assert not isinstance(result, Rejected)
    first, second, third = result.items
    assert first == ValidText("a") and third == ValidText("c", "d")
    assert "texts[1]" in assert_rejected(second, ErrorCode.INVALID_OPTION).message


# --- decode_body directly -------------------------------------------------------------------


def test_decode_body_str_with_json_media_is_a_pre_parsed_json_string() -> None:
    """A str with a JSON media type is what TorchServe hands over for a JSON string body."""
    result = decode_body('{"text": "hi"}', "application/json", LIMIT, MAX_TEXTS)
    assert "a string" in assert_rejected(result, ErrorCode.INVALID_TYPE).message


@pytest.mark.parametrize("media", ["application/json", "application/problem+json"])
def test_decode_body_takes_a_normalised_media_type(media: str) -> None:
    """decode_body is called with a lower-case media type without parameters."""
    assert decode_body(b'{"text": "hi"}', media, LIMIT, MAX_TEXTS) == ValidText("hi")
