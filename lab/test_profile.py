"""The test suite's profile from the JUnit XML scripts/test.sh writes: the slowest tests (each
with its fixtures' setup and teardown) and each file's total, as Markdown for docs/testing.md.

    python -m lab.test_profile build/test-times.xml --top 25
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def times(report: Path) -> dict[str, float]:
    """Seconds per test id (``file::name``), from every ``testcase`` of the report."""
    found = {}
    for case in ET.parse(report).iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        found[f"{path}.py::{case.get('name')}"] = float(case.get("time", 0))
    return found


def markdown(found: dict[str, float], top: int) -> str:
    by_file: defaultdict[str, float] = defaultdict(float)
    for test, seconds in found.items():
        by_file[test.split("::")[0]] += seconds
    total = sum(found.values())
    lines = [f"{len(found)} tests, {total / 60:.1f} min in all.", "", "| test | s |", "|---|---:|"]
    lines += [f"| `{t}` | {s:.0f} |" for t, s in sorted(found.items(), key=lambda x: -x[1])[:top]]
    lines += ["", "| file | s |", "|---|---:|"]
    ranked = sorted(by_file.items(), key=lambda x: -x[1])[:top]
    lines += [f"| `{f}` | {s:.0f} |" for f, s in ranked]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(markdown(times(args.report), args.top))


if __name__ == "__main__":
    main()
