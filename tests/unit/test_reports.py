"""The benchmark's bars, computed from a run's numbers."""

from __future__ import annotations

import pytest

from lab.reports import bench_ratios, ceiling_at

BY_SIZE = {
    "1": {"texts_per_s": 100.0},
    "8": {"texts_per_s": 180.0},
    "16": {"texts_per_s": 200.0},
    "32": {"texts_per_s": 210.0},
}


def test_the_ceiling_at_a_formed_batch_is_read_between_the_measured_sizes() -> None:
    assert ceiling_at(BY_SIZE, 12) == pytest.approx(190.0)
    assert ceiling_at(BY_SIZE, 8) == pytest.approx(180.0)
    assert ceiling_at(BY_SIZE, 0.5) == 100.0
    assert ceiling_at(BY_SIZE, 64) == 210.0


def level(rps: float, mean_batch: float = 1.0) -> dict[str, float]:
    return {"rps": rps, "p50_ms": 10.0, "errors": 0, "mean_batch_size": mean_batch}


def test_issue_20s_bars_are_reported_with_the_benchmark_issues() -> None:
    results = {
        "ceiling": {"texts_per_s": 210.0, "best_batch_size": 32, "by_batch_size": BY_SIZE},
        "scenarios": {
            "torchserve_batched": {"by_concurrency": {"1": level(40.0), "32": level(160.0, 12)}},
            "litserve": {"by_concurrency": {"1": level(50.0), "32": level(80.0)}},
        },
    }
    bars = bench_ratios(results)["bars"]
    assert bars["default_vs_ceiling_at_32"] == {"value": 0.76, "bar": ">= 0.8", "met": False}
    assert bars["default_vs_best_ceiling_at_32"] == {"value": 0.76, "bar": ">= 0.75", "met": True}
    assert bars["default_vs_ceiling_at_formed_batch_at_32"]["value"] == 0.84
    assert bars["default_vs_ceiling_at_formed_batch_at_32"]["met"]
    assert bars["default_vs_litserve_at_1"] == {"value": 0.8, "bar": ">= 1.0", "met": False}
    assert bars["default_vs_litserve_at_32"]["value"] == 2.0
