"""The frontend queue's wait as the age of unstamped requests (handler.queue_age), and what the
batch does with it (handler.pipeline.expire): plain requests that queued past the server's
budget are refused unworked, with Retry-After; patient load within it is never refused."""

from __future__ import annotations

import json

import pytest

from handler.deadline import Pace, deadline
from handler.pipeline import IncomingRequest, answer_batch, run_batch
from handler.queue_age import FRESH_FOR_S, RETRY_AFTER_FAILURE_S, QueueAge, queue_time_s
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
