"""The GPU report's pure parts: the load split over processes and pooled back, the workers swept
around the rule's choice, what stops a server, the bars, and the budget of the GPU call."""

from __future__ import annotations

from typing import Any

import pytest

from lab.gpu_findings import bars, limit
from lab.gpu_load import pooled, shares
from lab.gpu_report import GPU_PLAN, SMOKE_PLAN, workers_swept
from lab.gpu_runs import largest_change, worker_seconds


def test_clients_are_split_evenly_over_the_load_processes_none_empty() -> None:
    assert shares(512, 6) == [86, 86, 85, 85, 85, 85]
    assert shares(1, 6) == [1]
    assert shares(4, 6) == [1, 1, 1, 1]
    assert sum(shares(257, 6)) == 257


def test_a_levels_parts_pool_into_one_summary() -> None:
    parts = [
        {"ms": [1.0, 2.0, 3.0], "statuses": {"200": 3}, "elapsed": 1.0, "cpu_s": 0.5},
        {"ms": [4.0], "statuses": {"200": 1, "503": 2}, "elapsed": 2.0, "cpu_s": 0.5},
    ]
    level = pooled(parts, 8)
    assert level["requests"] == 6 and level["errors"] == 2
    assert level["statuses"] == {"200": 4, "503": 2}
    assert level["rps"] == 2.0  # 4 answered over the longest part's 2 s
    assert level["p50_ms"] == 2.5 and level["load_generator_cores"] == 0.5


def test_the_sweep_starts_at_the_rules_choice_and_never_goes_below_one_worker() -> None:
    assert workers_swept(4, 2) == [4, 2, 3, 5, 6]
    assert workers_swept(1, 2) == [1, 2, 3]
    assert workers_swept(2, 1) == [2, 1, 3]


@pytest.mark.parametrize(
    ("level", "found"),
    [
        ({"gpu_busy_pct": 91.0, "host_cpu_busy_pct": 99.0}, "the GPU"),
        ({"gpu_busy_pct": 40.0, "host_cpu_busy_pct": 95.0}, "the host CPU"),
        (
            {
                "host_cpu_busy_pct": 60.0,
                "cores": {"workers": 3.8},
                "seconds": 1.0,
                "tokenize_s": 3.0,
            },
            "tokenization",
        ),
        (
            {
                "host_cpu_busy_pct": 60.0,
                "cores": {"workers": 3.8},
                "seconds": 1.0,
                "tokenize_s": 0.5,
            },
            "the workers' Python",
        ),
        (
            {"gpu_busy_pct": None, "host_cpu_busy_pct": 50.0, "cores": {"workers": 1.0}},
            "the frontend",
        ),
    ],
)
def test_what_stops_a_server_follows_what_was_busy(level: dict[str, Any], found: str) -> None:
    assert limit(level, workers=4) == found


def ladder(rps: float, p50: float = 5.0) -> dict[str, Any]:
    return {c: {"rps": rps, "p50_ms": p50, "errors": 0} for c in ("1", "32", "256", "512")}


def test_the_bars_compare_the_rules_choice_with_the_best_of_its_sweep() -> None:
    results = {
        "sweep_fp32": {
            "rule_workers_per_gpu": 4,
            "by_workers_per_gpu": {"3": ladder(8000), "4": ladder(9500, 4.0), "5": ladder(10000)},
        },
        "sweep_bf16": {
            "rule_workers_per_gpu": 5,
            "by_workers_per_gpu": {"5": ladder(10500), "6": ladder(12000)},
        },
        "peer": {"by_concurrency": ladder(5000)},
        "scores": {"max_scores_change": 3e-6},
    }
    found = bars(results, (256, 512))
    assert found["fp32_default_vs_best_workers_at_256"] == {
        "value": 0.95,
        "bar": ">= 0.9",
        "met": True,
    }
    assert found["bf16_default_vs_best_workers_at_512"]["met"] is False  # 10500 / 12000
    assert found["bf16_default_rps"]["value"] == 10500 and found["bf16_default_rps"]["met"]
    assert found["fp32_default_p50_ms_at_1"]["value"] == 4.0
    assert found["default_vs_litserve_from_32"]["value"] == 1.9
    assert found["served_fp32_vs_cpu_scores"]["met"] is True


def test_worker_seconds_sum_the_handlers_batch_lines() -> None:
    lines = (
        "x batch_size=4 valid=4 rejected=0 sub_batches=[4] real_tokens=40 padded_tokens=48 "
        "explained=0 explain_ms=0.0 tokenize_ms=1.5 forward_ms=10.0 threads=1 expired=0\n"
        "y batch_size=1 valid=1 rejected=0 sub_batches=[1] real_tokens=9 padded_tokens=9 "
        "explained=0 explain_ms=0.0 tokenize_ms=0.5 forward_ms=2.0 threads=1 expired=0\n"
    )
    assert worker_seconds(lines) == {"tokenize_s": 0.002, "forward_s": 0.012}


def test_the_largest_change_covers_scores_and_logits() -> None:
    served = [
        {
            "scores": {"negative": 0.2, "positive": 0.8},
            "logits": {"negative": -1.0, "positive": 1.0},
        }
    ]
    local = [
        {
            "scores": {"negative": 0.25, "positive": 0.75},
            "logits": {"negative": -1.0, "positive": 1.5},
        }
    ]
    change = largest_change(served, local)
    assert change["max_scores_change"] == pytest.approx(0.05)
    assert change["max_logits_change"] == pytest.approx(0.5)


def test_the_gpu_calls_runs_fit_in_one_device_call() -> None:
    """The report's budget plus the carried kit's setup (about 30 s) stays under the 8 minutes
    of one device call, and the smoke form runs every level of its plan."""
    assert GPU_PLAN.budget_s + 30 < 8 * 60
    assert GPU_PLAN.levels[0] == 1 and GPU_PLAN.levels[-1] == 512
    assert {32, 256, 512} <= set(GPU_PLAN.levels)
    assert SMOKE_PLAN.device == "cpu" and SMOKE_PLAN.shape == "tiny"
