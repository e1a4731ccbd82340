"""lab.sizing_repeats: the start's rule applied to each fresh measurement, by each size's best
round and by its median, and the summary of the choices and the chosen rate's spread (the
measurement faked: no model is loaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bert_serve_server import measure

from lab import sizing_repeats

SLOWED = 0.8
"""A round run while something else held the core: every size's rate times this."""


def test_each_run_gets_the_starts_choice_by_its_best_rounds_and_the_summary_counts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    curves = iter(
        [
            # 32 by its best rounds (95 >= 90); its median, two rounds of three slowed (76),
            # falls under 90 and the median's rule takes 64
            ({2: 50, 4: 60, 8: 70, 16: 80, 32: 95, 64: 100}, {32: 2}),
            ({2: 50, 4: 60, 8: 70, 16: 80, 32: 85, 64: 100}, {}),  # 64 by both
            ({2: 40, 4: 50, 8: 60, 16: 70, 32: 78, 64: 80}, {16: 1}),  # 32 by both
        ]
    )
    calls: list[list[Any]] = []

    def rates(what: str, mar: Path, args: list[Any]) -> dict[str, list[float]]:
        calls.append([what, args])
        curve, slowed = next(curves)
        return {
            str(size): [rate * SLOWED if i < slowed.get(size, 0) else rate for i in range(3)]
            for size, rate in curve.items()
        }

    monkeypatch.setattr(measure, "in_fresh_process", rates)
    report = sizing_repeats.run(Path("x.mar"), runs=3, threads=2)
    assert [run["batch_size"] for run in report["runs"]] == [32, 64, 32]
    assert [run["rate"] for run in report["runs"]] == [95, 100, 78]
    assert [run["by_median"]["batch_size"] for run in report["runs"]] == [64, 64, 32]
    assert report["runs"][0]["by_median"]["rates"][32] == 76
    assert report["runs"][2]["samples"][16] == [56, 70, 70]
    assert calls[0] == ["rates", [[2, 4, 8, 16, 32, 64], 2, 0]]
    assert report["summary"] == {
        "batch_sizes": {32: 2, 64: 1},
        "most_common": 2,
        "rate_min": 78,
        "rate_max": 100,
        "rate_spread": round(100 / 78 - 1, 3),
    }
    assert report["summary_by_median"]["batch_sizes"] == {64: 2, 32: 1}


def test_over_the_probes_speed_a_run_in_a_slow_spell_gets_the_rate_of_a_steady_machine() -> None:
    runs = [
        {"rate": 100.0, "probe_per_s": 1000.0},
        {"rate": 80.0, "probe_per_s": 800.0},  # the whole machine 20 % slower: the same
        {"rate": 90.0, "probe_per_s": 1200.0},  # faster machine, slower measurement: lower
    ]
    steady = sizing_repeats.at_steady_speed(runs)
    assert steady["rates"] == [100.0, 100.0, 75.0]
    assert steady["rate_spread"] == round(100 / 75 - 1, 3)
    assert steady["probe_spread"] == 0.5


def test_the_speed_probe_runs_on_its_cpu_for_the_blocks_seconds() -> None:
    with sizing_repeats.speed_probe(0) as rate:
        assert rate == []
    assert len(rate) == 1 and rate[0] > 0
