"""The spike part's reading of TorchServe's access log (harness.chaos.spike)."""

from __future__ import annotations

from harness.chaos.spike import frontend_latency

ACCESS_LINES = """\
2026-11-24T01:13:43,134 - /127.0.0.1:56342 "POST /predictions/bert HTTP/1.1" 503 0
2026-11-24T01:13:43,135 - /127.0.0.1:56364 "POST /predictions/bert HTTP/1.1" 503 2
2026-11-24T01:13:43,140 - /127.0.0.1:56366 "POST /predictions/bert HTTP/1.1" 200 310
2026-11-24T01:13:43,141 - /127.0.0.1:56368 "GET /ping HTTP/1.1" 200 1
2026-11-24T01:13:43,150 - a line cut short by the rotation "POST
"""


def test_the_frontends_time_per_answer_is_read_by_status() -> None:
    """Each prediction's line ends in its status and the ms the frontend held the request;
    other routes and a cut line are skipped."""
    by_status = frontend_latency(ACCESS_LINES)
    assert sorted(by_status) == ["200", "503"]
    assert by_status["503"]["count"] == 2
    assert by_status["503"]["p99_ms"] <= 2
    assert by_status["200"] == {"count": 1, "p50_ms": 310.0, "p99_ms": 310.0}
