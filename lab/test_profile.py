"""The test suite's profile from the JUnit XML scripts/test.sh writes: the slowest tests (each
with its fixtures' setup and teardown) and each file's total, as Markdown for docs/testing.md.

    python -m lab test-profile build/test-times-unit.xml build/test-times.xml \
        build/test-times-alone.xml --top 25
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from lab.report import tool_parser


def times(report: Path) -> dict[str, float]:
    """Seconds per test id (``file::name``), from every ``testcase`` of the report."""
    found = {}
    for case in ET.parse(report).iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        found[f"{path}.py::{case.get('name')}"] = float(case.get("time", 0))
    return found


def wall_seconds(report: Path) -> float:
    """The run's own time (the ``testsuite``'s): under pytest-xdist, less than its tests' sum."""
    return sum(float(suite.get("time", 0)) for suite in ET.parse(report).iter("testsuite"))


def markdown(found: dict[str, float], top: int, walls: dict[str, float] | None = None) -> str:
    by_file: defaultdict[str, float] = defaultdict(float)
    for test, seconds in found.items():
        by_file[test.split("::")[0]] += seconds
    total = sum(found.values())
    lines = [f"{len(found)} tests, {total / 60:.1f} min in all."]
    lines += [
        f"{name}: {seconds / 60:.1f} min of wall time." for name, seconds in (walls or {}).items()
    ]
    lines += ["", "| test | s |", "|---|---:|"]
    lines += [f"| `{t}` | {s:.0f} |" for t, s in sorted(found.items(), key=lambda x: -x[1])[:top]]
    lines += ["", "| file | s |", "|---|---:|"]
    ranked = sorted(by_file.items(), key=lambda x: -x[1])[:top]
    lines += [f"| `{f}` | {s:.0f} |" for f, s in ranked]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("test-profile", __doc__)
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    found = {test: s for report in args.reports for test, s in times(report).items()}
    walls = {report.name: wall_seconds(report) for report in args.reports}
    print(markdown(found, args.top, walls))
    return 0
