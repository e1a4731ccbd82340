"""Fuzzing request decoding and validation through TorchServe's own worker code (hypothesis).

Every batch goes through ``ts.service.Service.predict`` (tests/worker_harness.py) with a tiny
random BERT: the answers' labels don't matter, their shape does. Whatever a batch of 1..8
requests holds (any bytes, any Content-Type, any JSON, absurd nesting, form fields, hostile
X-Request-ID headers, text pairs of any type), each request gets exactly one answer, in order, whose body is strict
JSON: a 200 prediction or its own 400/413 error, never a 500, and a good item's scores never
depend on its batch-mates (the tiny model's wide init in tests/conftest.py makes that checkable).

``pytest --hypothesis-show-statistics`` shows which answers each property produced.
"""

from __future__ import annotations

import itertools
import json
import random
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from handler.values import HTTP_STATUS, ErrorCode
from tests.worker_harness import Answer, Sent, predict

LABELS = ("negative", "positive")
SUCCESS_KEYS = {"label", "score", "scores", "truncated", "request_id"}
CLIENT_ERROR_CODES = {code.value for code in ErrorCode} - {ErrorCode.INTERNAL_ERROR.value}
MAX_CHARS = 10_000  # config/model-config.yaml's max_chars, which the service below uses
GOOD_TEXT = "a fine sentence"
GOOD = Sent(GOOD_TEXT.encode())

# An independent oracle for handler/bert_handler.py's SANE_REQUEST_ID (ASCII only).
ID_FIRST = string.ascii_letters + string.digits
ID_REST = ID_FIRST + "._:-"


@pytest.fixture(scope="module")
def service(tiny_worker):
    """Not function-scoped: hypothesis may not use function-scoped fixtures in @given."""
    return tiny_worker().service


@pytest.fixture(scope="module")
def good_alone(service) -> dict[str, Any]:
    """The good item's answer when it is the only request of its batch."""
    (answer,) = predict(service, [GOOD])
    assert answer.status == 200
    return strict_json(answer.body)


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------- strategies

# What can travel in an HTTP header or a field name: any text but lone surrogates (which no
# UTF-8 wire can carry, and which the harness could not encode).
header_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
long_header_text = st.builds(
    lambda piece, times: piece * times,
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=4),
    st.integers(1, 5_000),
)

CONTENT_TYPES = (
    None,
    "",
    "text/plain",
    "application/json",
    "application/json; charset=latin-1",
    "APPLICATION/JSON",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "image/png",
)
JSON_CONTENT_TYPES = (
    "application/json",
    "application/json; charset=latin-1",
    "APPLICATION/JSON",
    " Application/Json ;charset=utf-8",
    "application/problem+json",
)
content_types = st.one_of(st.sampled_from(CONTENT_TYPES), header_text)
json_content_types = st.one_of(st.sampled_from(JSON_CONTENT_TYPES), content_types)

# Python's str.strip() white space, which the handler strips from X-Request-ID.
STRIPPED = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u2028\u3000"
sane_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}", fullmatch=True)
request_id_values = st.one_of(
    sane_ids,
    st.builds(
        lambda left, value, right: left + value + right,
        st.text(STRIPPED, max_size=3),
        sane_ids,
        st.text(STRIPPED, max_size=3),
    ),
    st.builds(  # around the 128-character limit
        lambda first, rest: first + rest,
        st.sampled_from(ID_FIRST),
        st.text(ID_REST, min_size=124, max_size=130),
    ),
    st.text(ID_REST + " \n<>/\\\"'é\u2028", max_size=20),
    header_text,
    long_header_text,
)
request_id_headers = st.one_of(
    st.just(()),
    st.tuples(
        st.tuples(
            st.sampled_from(["X-Request-ID", "x-request-id", "X-Request-Id", "X-REQUEST-ID"]),
            request_id_values,
        )
    ),
)


def random_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def repeated(piece: bytes, size: int) -> bytes:
    return (piece * (size // len(piece) + 1))[:size]


def utf8(text: str) -> bytes:
    """UTF-8, except that lone surrogates become the invalid bytes CESU-8 would write."""
    return text.encode("utf-8", "surrogatepass")


any_char = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr))
text_bodies = st.text(any_char, max_size=200).map(utf8)
near_limit_strings = st.builds(  # texts of about max_chars characters, without surrogates
    lambda piece, length: (piece * (length // len(piece) + 1))[:length],
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8),
    st.one_of(st.sampled_from([MAX_CHARS - 1, MAX_CHARS, MAX_CHARS + 1]), st.integers(0, 15_000)),
)
near_limit_texts = near_limit_strings.map(utf8)
bytes_bodies = st.one_of(
    st.binary(max_size=512),
    st.sampled_from([b"", b" ", b"\x00", b"\x00" * 64, b"\xff", b"\xc3", b"\xed\xa0\x80"]),
    text_bodies,
    near_limit_texts,
    st.builds(repeated, st.binary(min_size=1, max_size=64), st.integers(1, 60_000)),
    st.builds(random_bytes, st.integers(0, 2**32 - 1), st.integers(1, 60_000)),
)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(any_char, max_size=30)
)


def json_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Arrays, objects, and objects with a "text" key of any type."""
    keys = st.text(any_char, max_size=8)
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4),
        st.builds(
            lambda rest, text: {**rest, "text": text},
            st.dictionaries(keys, children, max_size=3),
            children,
        ),
    )


json_values = st.recursive(json_scalars, json_containers, max_leaves=12)
json_documents = st.builds(
    lambda value, ascii_only: utf8(json.dumps(value, ensure_ascii=ascii_only)),
    st.one_of(
        json_values,
        st.builds(lambda text: {"text": text}, st.one_of(st.text(any_char), near_limit_strings)),
        st.builds(  # list requests: any items, sometimes over the 64-text limit
            lambda texts: {"texts": texts},
            st.lists(st.one_of(st.text(any_char, max_size=40), json_scalars), max_size=70),
        ),
        st.builds(  # pairs: any second text, any type
            lambda text, pair: {"text": text, "text_pair": pair},
            st.one_of(st.text(any_char), near_limit_strings),
            st.one_of(json_values, near_limit_strings),
        ),
        st.builds(  # lists of pairs and texts
            lambda items: {"texts": items},
            st.lists(
                st.one_of(
                    st.text(any_char, max_size=40),
                    st.fixed_dictionaries(
                        {"text": st.text(any_char, max_size=40), "text_pair": json_values}
                    ),
                ),
                max_size=8,
            ),
        ),
        st.dictionaries(
            st.text(any_char, max_size=8).filter(lambda key: key != "text"), json_values, max_size=4
        ),
    ),
    st.booleans(),
)
lone_surrogate_json = st.builds(  # a "\ud800"-style escape written into the JSON text
    lambda before, code, after: (
        '{"text": ' + json.dumps(before)[:-1] + f"\\u{code:04x}" + json.dumps(after)[1:] + "}"
    ).encode(),
    st.text(max_size=10),
    st.integers(0xD800, 0xDFFF),
    st.text(max_size=10),
)
odd_json = st.one_of(
    st.sampled_from(
        [
            b'{"text": NaN}',
            b'{"text": -Infinity}',
            b"NaN",
            b"null",
            b'"just a string"',
            b'{"text": "a", "text": 5}',
            b'{"text": "\\u0000"}',
            b'{"text": "\\ud83d\\ude00"}',
            b'{"text": "\\udc00\\ud800"}',
            b'\xef\xbb\xbf{"text": "after a BOM"}',
            b'{"text": "ok"} trailing',
        ]
    ),
    st.integers(4_000, 6_000).map(lambda digits: b'{"text": ' + b"9" * digits + b"}"),
)
nesting_depths = st.one_of(
    st.sampled_from([998, 999, 1000, 1001, 100_000]), st.integers(1, 100_000)
)
deep_json = st.one_of(
    nesting_depths.map(lambda n: b"[" * n + b"]" * n),
    nesting_depths.map(lambda n: b'{"text":' * n + b'"x"' + b"}" * n),
    nesting_depths.map(lambda n: b'{"text": ' + b"[" * n + b"]" * n + b"}"),
    nesting_depths.map(lambda n: b"[" * n),
)

field_names = st.one_of(
    st.sampled_from(["text", "body", "data", "Text", "TEXT", "", "text ", "X-Request-ID"]),
    header_text,
)
field_values = st.one_of(st.binary(max_size=256), text_bodies, near_limit_texts)
form_fields = st.one_of(
    st.lists(st.tuples(field_names, field_values), min_size=1, max_size=5),
    st.tuples(st.tuples(st.sampled_from(["text", "body", "data"]), field_values)),
).map(tuple)

raw_requests = st.builds(
    Sent, body=bytes_bodies, content_type=content_types, headers=request_id_headers
)
json_requests = st.builds(
    Sent,
    body=st.one_of(json_documents, lone_surrogate_json, odd_json),
    content_type=json_content_types,
    headers=request_id_headers,
)
deep_requests = st.builds(
    Sent,
    body=deep_json,
    content_type=st.sampled_from(JSON_CONTENT_TYPES),
    headers=request_id_headers,
)
form_requests = st.builds(
    Sent,
    body=st.one_of(st.none(), st.binary(max_size=64)),
    content_type=content_types,
    headers=request_id_headers,
    fields=form_fields,
)
bodiless_requests = st.builds(
    Sent, body=st.none(), content_type=content_types, headers=request_id_headers
)
any_request = st.one_of(
    raw_requests, json_requests, deep_requests, form_requests, bodiless_requests
)


def batches(requests: st.SearchStrategy[Sent]) -> st.SearchStrategy[list[Sent]]:
    return st.lists(requests, min_size=1, max_size=8)


# ------------------------------------------------------------------------------- checks


def strict_json(raw: bytes) -> Any:
    """The body as UTF-8 JSON, refusing NaN and Infinity, which are not JSON."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON: {raw[:300]!r}")

    return json.loads(raw.decode("utf-8"), parse_constant=refuse)


def is_sane(request_id: str) -> bool:
    return (
        1 <= len(request_id) <= 128
        and request_id[0] in ID_FIRST
        and all(char in ID_REST for char in request_id)
    )


def expected_request_id(sent: Sent, index: int) -> str:
    for name, value in sent.headers:
        if name.lower() == "x-request-id" and is_sane(value.strip()):
            return value.strip()
    return f"ts-{index}"


def check_success(document: dict[str, Any]) -> None:
    if "results" in document:  # a list request: one prediction or error per text
        assert set(document) == {"results", "request_id"}, document
        for entry in document["results"]:
            if "error" in entry:
                assert set(entry) == {"error"} and entry["error"]["code"] in CLIENT_ERROR_CODES, (
                    entry
                )
            else:
                check_success({**entry, "request_id": document["request_id"]})
        return
    assert SUCCESS_KEYS <= set(document) <= SUCCESS_KEYS | {"windows"}, document
    if "windows" in document:  # a long text classified whole
        assert isinstance(document["windows"], int) and document["windows"] >= 2, document
        assert document["truncated"] is False, document
    scores = document["scores"]
    assert set(scores) == set(LABELS), document
    assert all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in scores.values()), document
    assert sum(scores.values()) == pytest.approx(1.0, abs=1e-4), document
    assert document["label"] in LABELS, document
    assert document["score"] == scores[document["label"]] == max(scores.values()), document
    assert isinstance(document["truncated"], bool), document


def check_error(status: int, document: dict[str, Any]) -> None:
    assert status in (400, 413), f"status {status}: {document}"
    assert set(document) == {"error", "request_id"}, document
    error = document["error"]
    assert set(error) == {"code", "message"}, document
    assert error["code"] in CLIENT_ERROR_CODES, document
    assert HTTP_STATUS[ErrorCode(error["code"])][0] == status, document
    assert isinstance(error["message"], str) and error["message"], document


def check_answers(sent: list[Sent], answers: list[Answer]) -> list[dict[str, Any]]:
    """Every answer well formed, with the request ID it should carry; returns the bodies."""
    assert len(answers) == len(sent)
    documents = []
    for index, (request, answer) in enumerate(zip(sent, answers, strict=True)):
        assert answer.content_type == "application/json"
        document = strict_json(answer.body)
        assert isinstance(document, dict), document
        if answer.status == 200:
            check_success(document)
            event("answer: 200")
        else:
            check_error(answer.status, document)
            event(f"answer: {answer.status} {document['error']['code']}")
        assert document["request_id"] == expected_request_id(request, index), request.headers
        documents.append(document)
    return documents


def fuzz(service, sent: list[Sent]) -> list[dict[str, Any]]:
    """One batch through the worker; predict() checks the 200 frame and the ID order."""
    sizes = [len(request.body or b"") for request in sent]
    event(f"batch of {len(sent)}")
    event("largest body: " + ("> 10 KB" if max(sizes) > 10_000 else "<= 10 KB"))
    return check_answers(sent, predict(service, sent))


# -------------------------------------------------------------------------------- tests


@fuzz_settings(max_examples=400)
@given(sent=batches(raw_requests))
def test_any_bytes_body_and_content_type_gets_a_well_formed_answer(service, sent) -> None:
    """Any bytes (invalid UTF-8, NUL, up to 60 KB) under any Content-Type: 200 or own 4xx."""
    fuzz(service, sent)


@fuzz_settings(max_examples=400)
@given(sent=batches(json_requests))
def test_any_json_document_gets_a_well_formed_answer(service, sent) -> None:
    """Any JSON value, lone-surrogate escape or odd JSON text: 200 or own 4xx, never 500."""
    fuzz(service, sent)


@fuzz_settings(max_examples=150)
@given(sent=batches(deep_requests))
def test_deeply_nested_json_gets_a_client_error(service, sent) -> None:
    """JSON nested up to 100,000 deep never crashes the worker or answers 500."""
    documents = fuzz(service, sent)
    for request, document in zip(sent, documents, strict=True):
        if request.body.startswith(b"["):  # never an object, whatever parses
            assert document["error"]["code"] in ("invalid_json", "invalid_type"), document


@fuzz_settings(max_examples=300)
@given(sent=batches(st.one_of(form_requests, bodiless_requests)))
def test_form_fields_get_a_well_formed_answer(service, sent) -> None:
    """Form fields with any names and byte values, or no body at all: 200 or own 4xx."""
    fuzz(service, sent)


@fuzz_settings(max_examples=300)
@given(
    sent=batches(
        st.builds(
            Sent,
            body=st.one_of(st.just(GOOD.body), bytes_bodies),
            content_type=content_types,
            headers=request_id_headers,
        )
    )
)
def test_request_id_is_the_clients_only_when_sane(service, sent) -> None:
    """The body's request_id is the stripped X-Request-ID when sane, else ts-<index>."""
    fuzz(service, sent)


@fuzz_settings(max_examples=400)
@given(sent=batches(any_request))
def test_mixed_batches_answer_every_request_in_order(service, sent) -> None:
    """Batches mixing every kind of junk: one well-formed answer per request, in order."""
    fuzz(service, sent)


def test_the_model_tells_texts_apart(service) -> None:
    """Different texts score >1e-3 apart, so the 1e-4 comparisons below can fail."""
    texts = [GOOD_TEXT, "terrible", "word " * 300, "中文", "ok", "the plot dragged on", "x"]
    alone = [strict_json(predict(service, [Sent(t.encode())])[0].body) for t in texts]
    positives = sorted(document["scores"]["positive"] for document in alone)
    gaps = [b - a for a, b in itertools.pairwise(positives)]
    assert min(gaps) > 1e-3, positives


GOOD_FORMS = (
    GOOD,
    Sent(json.dumps({"text": GOOD_TEXT}).encode(), "application/json"),
    Sent(None, "application/x-www-form-urlencoded", fields=(("text", GOOD_TEXT.encode()),)),
)


@fuzz_settings(max_examples=400)
@given(
    good=st.sampled_from(GOOD_FORMS),
    junk=st.lists(any_request, max_size=7),
    data=st.data(),
)
def test_bad_batch_mates_never_change_a_good_answer(service, good_alone, good, junk, data) -> None:
    """A good item anywhere among random junk gets 200 with its scores alone (within 1e-4)."""
    position = data.draw(st.integers(0, len(junk)), label="position")
    sent = [*junk[:position], good, *junk[position:]]
    answer = fuzz(service, sent)[position]
    assert answer.get("error") is None, answer
    assert answer["truncated"] is good_alone["truncated"]
    for label, probability in good_alone["scores"].items():
        assert answer["scores"][label] == pytest.approx(probability, abs=1e-4)
