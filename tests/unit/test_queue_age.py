"""The frontend queue's wait as the age of unstamped requests (handler.queue_age), and what the
batch does with it (handler.pipeline.expire): plain requests that queued past the server's
budget are refused unworked, with Retry-After; patient load within it is never refused."""

from __future__ import annotations

import json

import pytest

from handler.deadline import Pace, deadline
from handler.pipeline import IncomingRequest, answer_batch, run_batch
from handler.protocol import Response
from handler.queue_age import (
    FRESH_FOR_S,
    OVERLOAD_HOLD_S,
    OVERLOAD_WINDOW_S,
    RETRY_AFTER_FAILURE_S,
    QueueAge,
    frontend_refusals,
    queue_time_s,
)
from handler.settings import HandlerSettings
from tests.stub_http import stub_server
from tests.unit.test_pipeline import FakeClassifier, body_of

NOW = 1_800_000_000.0
PROMETHEUS_TEXT = """\
# HELP QueueTime Torchserve prometheus gauge metric with unit: Milliseconds
# TYPE QueueTime gauge
QueueTime{Level="Host",Hostname="box",} 742.0
"""


def test_the_gauge_is_read_in_seconds_from_prometheus_text() -> None:
    assert queue_time_s(PROMETHEUS_TEXT) == pytest.approx(0.742)
    assert queue_time_s("QueueTime 12\n") == pytest.approx(0.012)
    assert queue_time_s("# HELP QueueTime nothing yet\n") is None
    assert queue_time_s("QueueTimeOther{} 5.0\nRequests2XX{} 9.0\n") is None


class FakeEndpoint:
    def __init__(self, text: str = PROMETHEUS_TEXT, fails: bool = False) -> None:
        self.text, self.fails, self.calls, self.now = text, fails, 0, 100.0

    def fetch(self, url: str) -> str:
        self.calls += 1
        if self.fails:
            raise OSError("connection refused")
        return self.text

    def age(self) -> QueueAge:
        return QueueAge(url="http://x/metrics", fetch=self.fetch, clock=lambda: self.now)


PLAIN: dict[str, str] = {}
STAMPED = {"X-Request-Start": "t=1800000000"}


def test_only_a_full_batch_with_an_unstamped_request_reads_the_gauge() -> None:
    """A partial batch had no backlog; a fully stamped one needs no estimate; with batch size
    1 every batch is full, so none says anything; a reading is reused only briefly."""
    endpoint = FakeEndpoint()
    age = endpoint.age()
    assert age.of_batch([PLAIN] * 3, 16) is None
    assert age.of_batch([STAMPED] * 16, 16) is None
    assert endpoint.calls == 0
    assert age.of_batch([STAMPED] * 15 + [PLAIN], 16) == pytest.approx(0.742)
    assert age.of_batch([PLAIN, PLAIN], 2) == pytest.approx(0.742)
    assert endpoint.calls == 1
    assert age.of_batch([PLAIN], 1) is None
    endpoint.now += 2 * FRESH_FOR_S
    age.of_batch([PLAIN] * 16, 16)
    assert endpoint.calls == 2


def test_an_unreadable_endpoint_gives_no_estimate_and_is_not_asked_every_batch() -> None:
    endpoint = FakeEndpoint(fails=True)
    age = endpoint.age()
    assert age.of_batch([PLAIN] * 16, 16) is None
    endpoint.now += RETRY_AFTER_FAILURE_S / 2
    assert age.of_batch([PLAIN] * 16, 16) is None
    assert endpoint.calls == 1
    endpoint.fails = False
    endpoint.now += RETRY_AFTER_FAILURE_S
    assert age.of_batch([PLAIN] * 16, 16) == pytest.approx(0.742)


def test_the_queue_age_dates_requests_without_a_start_stamp_only() -> None:
    assert deadline({}, 0.5, NOW, queue_age_s=0.7) == pytest.approx(NOW - 0.2)
    assert deadline({"grpc-timeout": "400m"}, 0.5, NOW, 0.1) == pytest.approx(NOW + 0.3)
    stamped = {"X-Request-Start": f"t={NOW - 0.1}"}
    assert deadline(stamped, 0.5, NOW, queue_age_s=5.0) == pytest.approx(NOW + 0.4)
    assert deadline({}, 0.0, NOW, queue_age_s=5.0) is None


def request(text: str, request_id: str, **headers: str) -> IncomingRequest:
    body = json.dumps({"text": text}).encode()
    return IncomingRequest({"body": body}, "application/json", request_id, headers=headers)


def test_plain_requests_that_queued_past_the_budget_are_refused_with_retry_after() -> None:
    """0.7 s in the queue against the 0.5 s budget: 504 unworked, Retry-After set; the stamped
    batch-mate within its own deadline is answered."""
    plain = request("plain", "p")
    stamped = request("stamped", "s", **{"X-Request-Start": f"t={NOW}", "X-Request-Timeout": "2"})
    classifier = FakeClassifier()
    responses, headers = answer_batch(
        [plain, stamped], classifier, HandlerSettings(), now=NOW, queue_age_s=0.7
    )
    assert classifier.calls == [["stamped"]]
    assert [r.status for r in responses] == [504, 200]
    assert body_of(responses[0])["error"]["code"] == "deadline_exceeded"
    assert ("Retry-After", "1") in headers[0]
    assert all(name != "Retry-After" for name, _ in headers[1])


def test_patient_load_within_the_budget_is_not_refused_for_its_batchs_own_time() -> None:
    """0.3 s queued and a batch expected to take 0.4 s: a plain request (no stated wait) is
    worked on, since the budget bounds the queue only; one that says it waits 0.5 s is not."""
    plain = request("plain", "p")
    says = request("says", "s", **{"X-Request-Timeout": "0.5"})
    classifier = FakeClassifier()
    answered, refused = run_batch(
        [plain, says], classifier, HandlerSettings(), now=NOW, pace=Pace(0.2), queue_age_s=0.3
    )
    assert classifier.calls == [["plain"]]
    assert (answered.status, refused.status) == (200, 504)


def counters(errors_5xx: float, ours_504: float) -> str:
    return (
        PROMETHEUS_TEXT
        + "# TYPE Requests5XX counter\n"
        + f'Requests5XX{{Level="Host",Hostname="box",}} {errors_5xx}\n'
        + 'ItemsRejected{Reason="empty_text",ModelName="bert",Level="Model",Hostname="box",} 7.0\n'
        + 'ItemsRejected{Reason="deadline_exceeded",ModelName="bert",Level="Model",'
        + f'Hostname="box",}} {ours_504}\n'
    )


def test_the_frontends_own_refusals_are_its_5xx_less_the_workers_504s() -> None:
    assert frontend_refusals(counters(120.0, 20.0)) == 100.0
    assert frontend_refusals(counters(5.0, 0.0)) == 5.0
    assert frontend_refusals(PROMETHEUS_TEXT) == 0.0, "no 5xx yet: the counter is not listed"


def test_the_first_refusals_are_measured_against_none_listed() -> None:
    """Before its first 5xx the frontend does not list ``Requests5XX``: a reading then is the
    zero the first refusals are compared with."""
    endpoint = FakeEndpoint(PROMETHEUS_TEXT)
    age = endpoint.age()
    age.seconds()
    endpoint.now += 1.0
    endpoint.text = counters(300.0, 0.0)
    age.seconds()
    assert age.overloaded()


def test_the_server_is_overloaded_while_the_frontend_refuses_fast() -> None:
    """Readings half a second or more apart are compared: 90 refusals in 0.6 s (150/s) mean a
    full queue, for OVERLOAD_HOLD_S; as many 5xx that were all the workers' 504s do not, nor
    a handful, nor a counter that went back (a restarted frontend)."""
    endpoint = FakeEndpoint(counters(10.0, 0.0))
    age = endpoint.age()

    def read_after(seconds: float, errors_5xx: float, ours_504: float) -> bool:
        endpoint.now += seconds
        endpoint.text = counters(errors_5xx, ours_504)
        age.seconds()
        return age.overloaded()

    assert not read_after(0.0, 10.0, 0.0)
    assert not read_after(OVERLOAD_WINDOW_S / 2, 300.0, 0.0), "compared before the window"
    assert not read_after(OVERLOAD_WINDOW_S, 600.0, 590.0), "every new 5xx was a worker's 504"
    assert read_after(0.6, 700.0, 600.0)
    endpoint.now += OVERLOAD_HOLD_S - 0.1
    assert age.overloaded()
    endpoint.now += 0.2
    assert not age.overloaded()
    assert not read_after(0.0, 705.0, 600.0), "5 refusals"
    read_after(1.0, 100.0, 0.0)
    assert not read_after(1.0, 110.0, 0.0), "compared with the restarted frontend's count"


def test_overloaded_a_plain_request_is_held_to_the_budget_end_to_end() -> None:
    """0.3 s queued and a batch expected to take 0.4 s: past the 0.5 s budget by the batch's
    end. Normally a plain request is held to the budget in the queue only and is worked on;
    while the frontend refuses for a full queue it is refused unworked, and a batch-mate whose
    stated wait covers the batch is still answered."""
    plain = request("plain", "p")
    says = request("says", "s", **{"X-Request-Timeout": "5"})
    classifier = FakeClassifier()
    refused, answered = run_batch(
        [plain, says],
        classifier,
        HandlerSettings(),
        now=NOW,
        pace=Pace(0.2),
        queue_age_s=0.3,
        overloaded=True,
    )
    assert classifier.calls == [["says"]]
    assert (refused.status, answered.status) == (504, 200)
    assert body_of(refused)["error"]["code"] == "deadline_exceeded"


def batch_of(
    batch: list[IncomingRequest], overloaded: bool, queue_age_s: float, pace: Pace
) -> tuple[list[Response], list[list[str]]]:
    """The batch's responses, and the texts the classifier was given."""
    classifier = FakeClassifier()
    responses = run_batch(
        batch,
        classifier,
        HandlerSettings(),
        now=NOW,
        pace=pace,
        queue_age_s=queue_age_s,
        overloaded=overloaded,
    )
    return responses, classifier.calls


def plain_then_patient() -> list[IncomingRequest]:
    """Four plain one-text requests, then one that states a long wait."""
    batch = [request(f"p{i}", f"p{i}") for i in range(4)]
    return [*batch, request("says", "s", **{"X-Request-Timeout": "5"})]


def test_overloaded_the_batch_is_cut_to_what_ends_in_time() -> None:
    """0.1 s queued, 0.04 s a text: each request is held to half its wait, 0.25 s for the
    plain ones (half the 0.5 s budget), so the batch may end 0.15 s from now: three texts (0.12
    s), first come first kept. The fourth plain request is refused unworked, and so is the last
    one, whose own 5 s wait would have allowed it: its text would end the batch after the
    target of the three kept before it."""
    responses, calls = batch_of(plain_then_patient(), True, 0.1, Pace(0.04, timed_at=NOW))
    assert calls == [["p0", "p1", "p2"]]
    assert [r.status for r in responses] == [200, 200, 200, 504, 504]


def test_not_overloaded_the_same_batch_is_worked_on_whole() -> None:
    responses, calls = batch_of(plain_then_patient(), False, 0.1, Pace(0.04, timed_at=NOW))
    assert calls == [["p0", "p1", "p2", "p3", "says"]]
    assert [r.status for r in responses] == [200] * 5


def test_overloaded_a_stated_wait_is_held_to_half_of_it() -> None:
    """A batch of one-text requests that state 0.4 s, 0.1 s queued (the frontend's estimate),
    0.04 s a text: half the wait leaves 0.1 s from now, two texts."""
    batch = [request(f"t{i}", f"t{i}", **{"X-Request-Timeout": "0.4"}) for i in range(4)]
    responses, calls = batch_of(batch, True, 0.1, Pace(0.04, timed_at=NOW))
    assert calls == [["t0", "t1"]]
    assert [r.status for r in responses] == [200, 200, 504, 504]


def test_overloaded_plain_requests_past_the_target_are_all_refused_unless_the_pace_is_stale() -> (
    None
):
    """0.3 s queued is past the 0.25 s target before any work: every plain request is refused.
    Alone in the batch, with a pace not timed for a while, the first one is worked on anyway,
    so that one slow batch cannot keep the pace (and the refusals) up for good."""
    batch = [request(f"p{i}", f"p{i}") for i in range(3)]
    for timed_at, worked_on in ((NOW, []), (NOW - 60, [["p0"]])):
        responses, calls = batch_of(batch, True, 0.3, Pace(0.04, timed_at=timed_at))
        assert calls == worked_on
        refused = [r for r in responses if r.status == 504]
        assert len(refused) == 3 - len(worked_on)
        assert all("overloaded" in body_of(r)["error"]["message"] for r in refused)


def test_the_gauge_is_read_over_one_kept_connection() -> None:
    """A real HTTP endpoint: two reads, one TCP connection; a 404 is a failed read."""
    from handler.queue_age import KeptConnection

    connections: set[int] = set()

    def metrics(path: str, client_port: int) -> tuple[int, bytes]:
        connections.add(client_port)
        body = PROMETHEUS_TEXT.encode() if "QueueTime" in path else b"no"
        return (200 if path.startswith("/metrics") else 404), body

    with stub_server(metrics, keep_alive=True) as base:
        fetch = KeptConnection()
        for _ in range(2):
            assert queue_time_s(fetch(f"{base}/metrics?name[]=QueueTime")) == pytest.approx(0.742)
        assert len(connections) == 1
        with pytest.raises(OSError):
            fetch(f"{base}/elsewhere?x=1")
