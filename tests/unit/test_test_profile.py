"""lab/test_profile.py reads the JUnit XML that scripts/test.sh writes."""

from __future__ import annotations

from pathlib import Path

from lab.test_profile import markdown, times, wall_seconds

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="61.5">
<testcase classname="tests.unit.test_a" name="test_fast" time="0.5" />
<testcase classname="tests.integration.test_b" name="test_slow[x]" time="90.0" />
<testcase classname="tests.integration.test_b" name="test_other" time="30.0" />
</testsuite></testsuites>"""


def test_profile_ranks_tests_and_files(tmp_path: Path) -> None:
    report = tmp_path / "times.xml"
    report.write_text(REPORT)
    found = times(report)
    assert found == {
        "tests/unit/test_a.py::test_fast": 0.5,
        "tests/integration/test_b.py::test_slow[x]": 90.0,
        "tests/integration/test_b.py::test_other": 30.0,
    }
    table = markdown(found, top=2).splitlines()
    assert table[0] == "3 tests, 2.0 min in all."
    assert table[4:6] == [
        "| `tests/integration/test_b.py::test_slow[x]` | 90 |",
        "| `tests/integration/test_b.py::test_other` | 30 |",
    ]
    assert "| `tests/integration/test_b.py` | 120 |" in table


def test_the_wall_time_is_the_runs_not_the_tests_sum(tmp_path: Path) -> None:
    """Under pytest-xdist the unit layer's tests overlap: its wall time is the run's own."""
    report = tmp_path / "times.xml"
    report.write_text(REPORT)
    assert wall_seconds(report) == 61.5
    table = markdown(times(report), top=1, walls={"times.xml": 61.5}).splitlines()
    assert table[:2] == ["3 tests, 2.0 min in all.", "times.xml: 1.0 min of wall time."]
