"""The spike part's reading of TorchServe's access log and batch lines, and the cores each
process used (lab.chaos.spike, lab.measure)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lab.batchlog import batch_times
from lab.chaos.spike import cores_by_role, frontend_latency
from lab.measure import cores_used

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


MODEL_LINES = """\
MODEL_LOG - batch_size=16 valid=16 rejected=0 sub_batches=[9, 7] real_tokens=1 padded_tokens=1 \
tokenize_ms=9.9 forward_ms=568.9 threads=1 expired=0
MODEL_LOG - batch_size=16 valid=0 rejected=16 sub_batches=[] real_tokens=0 padded_tokens=0 \
tokenize_ms=0.0 forward_ms=0.0 threads=0 expired=16
MODEL_LOG - batch_size=16 valid=12 rejected=4 sub_batches=[12] real_tokens=1 padded_tokens=1 \
tokenize_ms=3.0 forward_ms=300.0 threads=1 expired=4
MODEL_LOG - rejected: 3f2a=deadline_exceeded 3f2b=deadline_exceeded
"""


def test_the_handlers_batch_lines_give_expiries_and_forward_times() -> None:
    """Expired requests are summed over every batch; forward times come from the batches that
    forwarded texts."""
    summary = batch_times(MODEL_LINES)
    assert summary["batches"] == 3 and summary["expired"] == 20
    assert summary["forward_ms_p50"] == pytest.approx(434.45, abs=0.1)


def test_the_forward_time_per_text_is_split_between_small_and_full_batches() -> None:
    """Texts forwarded are counted from the sub-batches; a batch of 16 texts in 568.9 ms is a
    full one at 35.6 ms a text, one of 2 texts in 50 ms a small one at 25 ms a text, and the
    batch of 12 is full too; a batch that forwarded nothing is in neither."""
    small = (
        "MODEL_LOG - batch_size=3 valid=2 rejected=1 sub_batches=[2] real_tokens=1 "
        "padded_tokens=1 tokenize_ms=1.0 forward_ms=50.0 threads=2 expired=1\n"
    )
    summary = batch_times(MODEL_LINES + small)
    assert summary["texts_forwarded"] == 16 + 12 + 2
    per_text = summary["forward_ms_per_text"]
    assert per_text["small"] == {"batches": 1, "p50": 25.0}
    assert per_text["full"]["batches"] == 2
    assert per_text["full"]["p50"] == pytest.approx((568.9 / 16 + 300.0 / 12) / 2, abs=0.1)


def test_the_cores_used_are_summed_by_role() -> None:
    cores = {"load_generator": 0.5, "frontend": 0.25, "worker_0": 0.625, "worker_1": 0.5}
    assert cores_by_role(cores) == {"load_generator": 0.5, "frontend": 0.25, "workers": 1.125}


def test_the_cores_a_process_used_are_measured_and_a_gone_one_is_left_out() -> None:
    """A busy loop of this process uses about one core; a process that has ended (a reaped
    child) cannot be measured and is not reported as 0."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with cores_used({"this": os.getpid(), "gone": child.pid}) as cores:
        ends = time.process_time() + 0.3
        while time.process_time() < ends:
            pass
    assert sorted(cores) == ["this"]
    assert 0.25 < cores["this"] <= 1.2  # 0.299 seen: the clock's tick under the 0.3 s loop
