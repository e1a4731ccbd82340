"""The GPU report's arithmetic: a level's repeats pooled into a median and its spread, the bars
and figures read from them, and the default plan fitting one device call."""

from __future__ import annotations

from typing import Any

from lab import gpu_findings
from lab.gpu_load import pooled
from lab.gpu_report import GPU_PLAN, workers_swept


def part(served: int, elapsed: float = 1.0, cpu_s: float = 0.5) -> dict[str, Any]:
    return {"ms": [10.0] * served, "statuses": {"200": served}, "elapsed": elapsed, "cpu_s": cpu_s}


def level(rps: float, spread: float = 0.1, **extra: Any) -> dict[str, Any]:
    return {"rps": rps, "rps_spread": spread, "errors": 0} | extra


def test_repeats_give_the_median_rate_and_its_spread() -> None:
    """Three repeats of two load processes: each repeat's rate over its longest part."""
    runs = [[part(40), part(60)], [part(50, 2.0), part(50)], [part(70), part(50)]]
    found = pooled(runs, 4)
    assert found["rps_runs"] == [100.0, 50.0, 120.0]
    assert found["rps"] == 100.0 and found["rps_spread"] == 0.7
    assert found["requests"] == 320 and found["errors"] == 0 and found["seconds"] == 4.0
    assert found["load_generator_cpu_s"] == 3.0 and found["load_processes"] == 2


def test_the_sweep_leans_above_the_rule() -> None:
    assert workers_swept(2, (1, 2)) == [2, 1, 3, 4]
    assert workers_swept(1, (1, 2)) == [1, 2, 3]


def test_bars_and_figures_use_the_medians_and_state_the_spread() -> None:
    default = {"1": level(80, p50_ms=5.0), "256": level(900, padding_efficiency=0.35)}
    results = {
        "rule": {"workers": 2, "precision": {"plan": {"precision": "bf16"}, "worker_log": []}},
        "default": {
            "rule_workers_per_gpu": 2,
            "by_workers_per_gpu": {"2": default, "3": {"256": level(1000, 0.2)}},
        },
        "peer": {"by_concurrency": {"256": level(450, 0.05)}},
        "bs1": {"by_concurrency": {"256": level(300)}},
        "fp32": {
            "by_concurrency": {"256": level(450)},
            "scores_vs_cpu": {"max_scores_change": 2e-6},
            "default_top_label_agreement": 0.99,
        },
    }
    bars = gpu_findings.bars(results, (256,))
    assert bars["default_vs_best_workers_at_256"] == {
        "value": 0.9, "spread": 0.2, "bar": ">= 0.9", "met": True
    }  # fmt: skip
    assert bars["default_vs_litserve_from_32"]["value"] == 2.0
    assert bars["lone_p50_ms_default"]["met"] and bars["fp32_vs_cpu_scores"]["met"]
    figures = gpu_findings.figures(results, 256)
    assert figures["default_vs_bs1_at_256"] == {
        "value": 3.0, "spread": 0.1, "bar": ">= 8", "met": False
    }  # fmt: skip
    assert figures["default_vs_fp32_at_256"]["value"] == 2.0
    assert figures["real_token_share_at_256"] == {"value": 0.35, "bar": ">= 0.85", "met": False}
    assert figures["top_label_agreement_vs_fp32"]["met"] is False
    assert not bars["default_rps_at_256"]["met"]
    assert figures["precision"]["plan"] == {"precision": "bf16"}


def test_the_bars_sections_fit_the_default_budget() -> None:
    """The default start with its sweep, fp32 pinned, LitServe, batchSize 1 and the lone
    request, by their estimates, within the budget of one device call."""
    plan, points = GPU_PLAN, sum(GPU_PLAN.sweep_span) + 1
    sweep = plan.estimate(1, len(plan.levels) + (points - 1) * len(plan.top), points - 1)
    rest = 3 * plan.estimate(0.5, 1) + plan.estimate(0.5, len(plan.from_32))
    assert plan.repeats >= 3 and plan.seconds >= 3
    assert sweep + rest + plan.estimate(1.5, 1) < plan.budget_s
