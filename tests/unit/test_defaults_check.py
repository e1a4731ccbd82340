"""lab/defaults_check.py: the bars computed from a run's levels."""

from __future__ import annotations

from typing import Any

from lab.defaults_check import bars


def levels(
    refusals: int, stated: float, unstated: float, late: int = 0, unstated_refusals: int = 9
) -> dict[str, Any]:
    return {
        "levels": {
            "capacity": {"goodput_per_s": 100.0},
            "patient": {"refusals": refusals},
            "stated": {
                "goodput_per_s": stated,
                "share_of_patient": stated / 100,
                "forwarded_late": late,
            },
            "unstated": {
                "goodput_per_s": unstated,
                "share_of_patient": unstated / 100,
                "refusals": unstated_refusals,
            },
        }
    }


def test_every_bar_met() -> None:
    assert all(bar["met"] for bar in bars("fast", levels(0, 65.0, 50.0)).values())


def test_each_bar_can_fail() -> None:
    assert not bars("fast", levels(1, 65.0, 50.0))["patient_refusals"]["met"]
    assert not bars("fast", levels(0, 55.0, 50.0))["stated_share_of_patient"]["met"]
    assert not bars("fast", levels(0, 65.0, 70.0))["stated_vs_unstated_goodput"]["met"]
    assert not bars("fast", levels(0, 65.0, 50.0, late=1))["forwarded_late"]["met"]


def test_the_default_model_needs_more_of_its_patient_throughput() -> None:
    assert bars("slow", levels(0, 65.0, 50.0))["stated_share_of_patient"]["met"]
    assert not bars("default", levels(0, 65.0, 50.0))["stated_share_of_patient"]["met"]


def test_stated_against_unstated_counts_only_under_a_spike() -> None:
    """Where every unstated request was answered (no spike), stated clients that got a little
    less are no failure; under a spike they are."""
    calm = bars("fast", levels(0, 65.0, 70.0, unstated_refusals=0))["stated_vs_unstated_goodput"]
    assert calm["met"] and "no spike" in calm["value"]
    assert not bars("fast", levels(0, 65.0, 70.0))["stated_vs_unstated_goodput"]["met"]
