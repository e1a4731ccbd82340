"""Deadlines that travel with the request: the headers read, and the per-request check at
batch start (handler.deadline, handler.pipeline.expire)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from handler.deadline import PACE_WINDOW, WAIT_TIME, Pace, client_wait, deadline, start_time
from handler.pipeline import answer_batch
from handler.settings import HandlerSettings
from handler.values import HTTP_STATUS, ErrorCode, IncomingRequest
from tests.unit.test_pipeline import FakeClassifier, body_of

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("t=1799999999.5", 1_799_999_999.5),
        ("1799999999.5", 1_799_999_999.5),
        ("t=1799999999500", 1_799_999_999.5),
        ("1799999999500000", 1_799_999_999.5),
        (" t=1799999999 ", 1_799_999_999.0),
    ],
)
def test_start_stamps_in_seconds_ms_and_us(value: str, expected: float) -> None:
    """NGINX sends t=<s.ms>, Heroku ms, New Relic's agents accept us: all mean the same time."""
    assert start_time({"X-Request-Start": value}) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["", "t=", "yesterday", "t=-5", "1e9", "t=1.2.3", "9" * 30])
def test_malformed_start_stamps_are_ignored(value: str) -> None:
    assert start_time({"X-Request-Start": value}) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Request-Timeout": "0.4"}, 0.4),
        ({"x-request-timeout": "2"}, 2.0),
        ({"grpc-timeout": "400m"}, 0.4),
        ({"grpc-timeout": "1S"}, 1.0),
        ({"grpc-timeout": "250000u"}, 0.25),
        ({"grpc-timeout": "2M"}, 120.0),
        ({"x-envoy-expected-rq-timeout-ms": "1500"}, 1.5),
        ({"X-Request-Timeout": "0.3", "grpc-timeout": "5S"}, 0.3),
        ({"X-Request-Timeout": "soon", "grpc-timeout": "5S"}, 5.0),
    ],
)
def test_client_waits_in_the_common_spellings(headers: dict[str, str], expected: float) -> None:
    assert client_wait(headers) == pytest.approx(expected)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Request-Timeout": "-1"},
        {"grpc-timeout": "400"},
        {"grpc-timeout": "1x"},
        {"x-envoy-expected-rq-timeout-ms": "1.5"},
    ],
)
def test_no_or_malformed_wait_is_none(headers: dict[str, str]) -> None:
    assert client_wait(headers) is None


def test_the_deadline_is_the_start_plus_the_clients_wait() -> None:
    """A stated wait, short or long, is the deadline; a request that states none is patient."""
    start = {"X-Request-Start": f"t={NOW - 1}"}
    assert deadline({**start, "X-Request-Timeout": "0.4"}, NOW) == pytest.approx(NOW - 0.6)
    assert deadline({**start, "X-Request-Timeout": "30"}, NOW) == pytest.approx(NOW + 29)
    assert deadline({**start, "grpc-timeout": "400m"}, NOW) == pytest.approx(NOW - 0.6)
    assert deadline(start, NOW) is None


def test_without_a_start_stamp_there_is_no_deadline() -> None:
    """The worker cannot see when a request arrived: a relative wait alone decides nothing."""
    assert deadline({"X-Request-Timeout": "0.001"}, NOW) is None
    assert deadline({}, NOW) is None


def test_a_start_stamp_from_the_future_counts_as_now() -> None:
    """A client clock ahead of the server's must not stretch its request's deadline."""
    ahead = {"X-Request-Start": f"t={NOW + 100}", "X-Request-Timeout": "0.4"}
    assert deadline(ahead, NOW) == pytest.approx(NOW + 0.4)


def request(text: str, request_id: str, **headers: str) -> IncomingRequest:
    body = json.dumps({"text": text}).encode()
    return IncomingRequest({"body": body}, "application/json", request_id, headers=headers)


def test_an_expired_request_is_not_forwarded_and_its_batch_mate_is_answered_as_alone() -> None:
    """The expired text never reaches the classifier; the fresh one's answer equals alone."""
    settings = HandlerSettings()
    expired = request(
        "a stale text", "late", **{"X-Request-Start": f"t={NOW - 2}", "X-Request-Timeout": "1"}
    )
    fresh = request(
        "a fresh text", "fresh", **{"X-Request-Start": f"t={NOW - 0.1}", "X-Request-Timeout": "1"}
    )
    unstamped = request("no stamp at all", "plain")
    classifier = FakeClassifier()
    late, on_time, plain = answer_batch([expired, fresh, unstamped], classifier, settings, now=NOW)[
        0
    ]

    assert classifier.calls == [["a fresh text", "no stamp at all"]]
    assert (late.status, late.phrase) == HTTP_STATUS[ErrorCode.DEADLINE_EXCEEDED]
    assert late.status == 504
    assert body_of(late)["error"]["code"] == "deadline_exceeded"
    assert body_of(late)["request_id"] == "late"

    alone = answer_batch([fresh], FakeClassifier(), settings, now=NOW)[0][0]
    assert on_time.status == 200
    assert on_time.body == alone.body
    assert plain.status == 200


def test_a_stated_start_comes_back_as_the_wait_before_the_batch() -> None:
    """x-wait-time: from X-Request-Start to the batch's start by the worker's clock, on answers
    and refusals alike (a client checks with it that nothing expired was worked on); none
    without a start stamp, 0 for a start in the worker's future."""
    stamped = [
        request("waited", "a", **{"X-Request-Start": f"t={NOW - 0.25}", "X-Request-Timeout": "9"}),
        request("expired", "b", **{"X-Request-Start": f"t={NOW - 2}", "X-Request-Timeout": "1"}),
        request("no wait stated", "c", **{"X-Request-Start": f"{(NOW - 0.5) * 1000:.0f}"}),
        request("ahead", "d", **{"X-Request-Start": f"t={NOW + 5}"}),
        request("plain", "e"),
    ]
    responses, headers = answer_batch(stamped, FakeClassifier(), HandlerSettings(), now=NOW)
    waits = [dict(h).get(WAIT_TIME) for h in headers]
    assert [r.status for r in responses] == [200, 504, 200, 200, 200]
    assert waits == ["250.000", "2000.000", "500.000", "0.000", None]


def test_a_stated_wait_that_ended_in_the_queue_expires_the_request() -> None:
    """0.3 s waited of a stated 0.2 s: expired, not forwarded."""
    client_says = {"X-Request-Start": f"t={NOW - 0.3}", "X-Request-Timeout": "0.2"}
    classifier = FakeClassifier()
    (response,) = answer_batch(
        [request("x", "r", **client_says)], classifier, HandlerSettings(), now=NOW
    )[0]
    assert response.status == 504
    assert classifier.calls == []


def test_a_list_request_expires_whole_and_an_open_inference_one_in_its_own_shape() -> None:
    stamp = {"X-Request-Start": f"t={NOW - 5}", "X-Request-Timeout": "1"}
    texts = IncomingRequest(
        {"body": json.dumps({"texts": ["a", "b"]}).encode()},
        "application/json",
        "list",
        headers=stamp,
    )
    v2_body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}
    v2 = IncomingRequest(
        {"body": json.dumps(v2_body).encode()},
        "application/json",
        "v2",
        headers={**stamp, "explain": "False"},
    )
    classifier = FakeClassifier()
    listed, infer = answer_batch([texts, v2], classifier, HandlerSettings(), now=NOW)[0]
    assert classifier.calls == []
    assert listed.status == infer.status == 504
    assert body_of(listed)["error"]["code"] == "deadline_exceeded"
    assert "deadline" in json.dumps(body_of(infer))


def test_a_request_that_states_no_wait_is_patient() -> None:
    """Stamped an hour ago but stating no wait: the server guesses none and answers it."""
    stamp = {"X-Request-Start": f"t={NOW - 3600}"}
    classifier = FakeClassifier()
    (response,) = answer_batch(
        [request("old but patient", "r", **stamp)],
        classifier,
        HandlerSettings(),
        now=NOW,
        pace=Pace(1.0),
    )[0]
    assert response.status == 200
    assert classifier.calls == [["old but patient"]]


def test_expired_requests_are_counted_by_reason_in_the_metrics() -> None:
    """ItemsRejected{Reason="deadline_exceeded"} (config/metrics.yaml) counts them."""
    from handler.metrics import batch_metrics, rejections_by_reason

    seen: list[Any] = []
    stamp = {"X-Request-Start": f"t={NOW - 5}", "X-Request-Timeout": "1"}
    batch = [request("a", "1", **stamp), request("b", "2", **stamp), request("c", "3")]
    answer_batch(
        batch, FakeClassifier(), HandlerSettings(), observe=lambda *a: seen.append(a), now=NOW
    )[0]
    ((outcomes, stats),) = seen
    assert rejections_by_reason(outcomes) == {"deadline_exceeded": 2}
    assert batch_metrics(outcomes, stats)["ItemsAccepted"] == 1


def test_a_client_that_says_it_waits_long_is_not_cut_short() -> None:
    """A bulk client (bert_serve.Client sends its 70 s timeout) queued 2 s is still answered."""
    patient = {"X-Request-Start": f"t={NOW - 2}", "X-Request-Timeout": "70"}
    classifier = FakeClassifier()
    (response,) = answer_batch(
        [request("bulk", "r", **patient)], classifier, HandlerSettings(), now=NOW
    )[0]
    assert response.status == 200
    assert classifier.calls == [["bulk"]]


def test_a_request_that_cannot_end_before_its_deadline_is_not_forwarded() -> None:
    """At 0.1 s a text, a batch of 3 texts ends 0.3 s after it began: a request due in 0.2 s
    is refused unworked, one due in 1 s and an unstamped one are answered. Without a pace
    (no batch timed yet) the first is worked on."""
    due_soon = request(
        "due soon", "soon", **{"X-Request-Start": f"t={NOW}", "X-Request-Timeout": "0.2"}
    )
    due_later = request(
        "due later", "later", **{"X-Request-Start": f"t={NOW}", "X-Request-Timeout": "1"}
    )
    plain = request("no stamp", "plain")
    classifier = FakeClassifier()
    soon, later, unstamped = answer_batch(
        [due_soon, due_later, plain], classifier, HandlerSettings(), now=NOW, pace=Pace(0.1)
    )[0]
    assert classifier.calls == [["due later", "no stamp"]]
    assert soon.status == 504
    assert "before its batch could end" in body_of(soon)["error"]["message"]
    assert (later.status, unstamped.status) == (200, 200)

    classifier = FakeClassifier()
    answer_batch([due_soon, due_later], classifier, HandlerSettings(), now=NOW, pace=Pace())[0]
    assert classifier.calls == [["due soon", "due later"]]


def test_a_batch_too_large_for_its_deadlines_is_cut_not_refused_whole() -> None:
    """At 0.1 s a text, eight requests due in 0.30 to 0.65 s cannot all end in time (0.8 s),
    but four can: those with the latest deadlines are worked on, the others refused."""
    waits = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65]
    batch = [
        request(
            f"text {wait}",
            str(wait),
            **{"X-Request-Start": f"t={NOW}", "X-Request-Timeout": f"{wait}"},
        )
        for wait in waits
    ]
    classifier = FakeClassifier()
    responses = answer_batch(batch, classifier, HandlerSettings(), now=NOW, pace=Pace(0.1))[0]
    assert [r.status for r in responses] == [504] * 4 + [200] * 4
    assert sorted(classifier.calls[0]) == [f"text {wait}" for wait in waits[4:]]


def test_the_pace_is_the_slowest_of_the_recent_batches() -> None:
    pace = Pace()
    assert pace.expected_s(16) == 0.0
    pace.record(4, 0.4)
    assert pace.expected_s(16) == pytest.approx(1.6)
    pace.record(10, 2.0)
    pace.record(10, 0.5)
    assert pace.seconds_per_text == pytest.approx(0.2)
    pace.record(0, 5.0)
    assert pace.seconds_per_text == pytest.approx(0.2)
    for _ in range(PACE_WINDOW - 1):
        pace.record(10, 0.5)
    assert pace.seconds_per_text == pytest.approx(0.05)


def test_the_handler_times_each_batch_into_its_pace() -> None:
    """answer_batch records the batch: its valid texts and how long it took."""
    pace = Pace()
    answer_batch(
        [request("one", "a"), request("two", "b")], FakeClassifier(), HandlerSettings(), pace=pace
    )
    assert len(pace.recent) == 1 and pace.seconds_per_text == pace.recent[0] > 0


def test_a_batch_the_pace_would_empty_still_works_on_its_latest_deadline() -> None:
    """After one slow cold batch (1 s a text) every request of the next batch looks late. The
    one with the latest deadline is worked on anyway, so the pace is timed again and comes
    down; the others are refused."""
    stamps = {"X-Request-Start": f"t={NOW}"}
    first = request("first", "a", **stamps, **{"X-Request-Timeout": "0.2"})
    second = request("second", "b", **stamps, **{"X-Request-Timeout": "0.4"})
    pace = Pace(1.0)
    classifier = FakeClassifier()
    refused, answered = answer_batch(
        [first, second], classifier, HandlerSettings(), now=NOW, pace=pace
    )[0]
    assert classifier.calls == [["second"]]
    assert (refused.status, answered.status) == (504, 200)
    assert pace.seconds_per_text is not None and pace.seconds_per_text < 1.0


def test_a_batch_the_pace_would_empty_is_refused_whole_while_the_pace_is_fresh() -> None:
    """Under a spike most batches are refused whole: working on one request of each would
    spend a forward pass per refused batch. Only a pace not timed for PACE_STALE_S is timed
    again that way."""
    from handler.deadline import PACE_STALE_S

    stamps = {"X-Request-Start": f"t={NOW}", "X-Request-Timeout": "0.2"}
    batch = [request("first", "a", **stamps), request("second", "b", **stamps)]
    classifier = FakeClassifier()
    fresh = Pace(1.0, timed_at=NOW - PACE_STALE_S / 2)
    responses = answer_batch(batch, classifier, HandlerSettings(), now=NOW, pace=fresh)[0]
    assert classifier.calls == []
    assert [r.status for r in responses] == [504, 504]
    stale = Pace(1.0, timed_at=NOW - PACE_STALE_S)
    answer_batch(batch, classifier, HandlerSettings(), now=NOW, pace=stale)[0]
    assert len(classifier.calls) == 1


def test_the_batch_log_line_counts_the_expired_requests(caplog) -> None:
    """Two lines a batch whatever it refuses: its counts, and its refused requests by id."""
    late = {"X-Request-Start": f"t={NOW - 5}", "X-Request-Timeout": "1"}
    with caplog.at_level(logging.INFO, logger="handler.pipeline"):
        answer_batch(
            [request("a", "a", **late), request("b", "b")],
            FakeClassifier(),
            HandlerSettings(),
            now=NOW,
        )[0]
    line, refused = [r.getMessage() for r in caplog.records]
    assert line.startswith("batch_size=2 valid=1 rejected=1 ")
    assert line.endswith(" expired=1")
    assert refused == "rejected: a=deadline_exceeded", "one line names the batch's refusals"
