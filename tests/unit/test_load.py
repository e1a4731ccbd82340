"""lab.load.ClosedLoop's impatient clients: a pause after a failure, and stamped requests."""

from __future__ import annotations

from collections.abc import Callable

from lab.load import ClosedLoop, json_job
from tests.unit.test_client import QUEUE_FULL, Stub, stub_factory

__all__ = ["stub_factory"]


def test_a_client_pauses_after_a_failure_and_stamps_each_request(
    stub_factory: Callable[..., Stub],
) -> None:
    stub = stub_factory(lambda body: (503, QUEUE_FULL))
    load = ClosedLoop(
        stub.url,
        {},
        lambda i: json_job(f"text {i}"),
        concurrency=1,
        seconds=1.0,
        request_timeout_s=3.0,
        pause_after_failure_s=0.4,
        stamped=True,
    ).run()
    assert 1 <= load.sent <= 3, "each 503 is followed by a 0.4 s pause"
    assert {o.status for o in load.outcomes} == {"503"}
    starts = [float(headers["X-Request-Start"][2:]) for headers, _ in stub.requests]
    assert all(headers["X-Request-Timeout"] == "3" for headers, _ in stub.requests)
    assert all(b - a >= 0.39 for a, b in zip(starts, starts[1:], strict=False))


def test_plain_requests_carry_no_stamp(stub_factory: Callable[..., Stub]) -> None:
    stub = stub_factory()
    ClosedLoop(stub.url, {}, lambda i: json_job("x"), 1, 5.0, max_requests=2).run()
    assert len(stub.requests) == 2
    assert not any("X-Request-Start" in headers for headers, _ in stub.requests)
