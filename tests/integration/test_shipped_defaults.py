"""`make check-defaults` in a short form: the shipped defaults on a stand-in model."""

from __future__ import annotations

import pytest


@pytest.mark.alone  # its bar of no refused patient client holds on a machine to itself
def test_defaults_check_runs_on_a_stand_in_model() -> None:
    """`make check-defaults` on the fast stand-in with one-second levels: every level ran and
    was answered; the sizing it reports is what the server ran. Its bars need a quiet machine
    and full levels, so only the one that holds on any machine is asserted: 256 patient
    clients are never refused."""
    from lab import defaults_check

    (result,) = defaults_check.run(("fast",), seconds=1.0).values()
    levels = result["levels"]
    assert set(levels) == {"capacity", "patient", "stated", "unstated"}
    assert all(level["silently_lost"] == 0 for level in levels.values())
    assert levels["capacity"]["goodput_per_s"] > 0
    assert levels["patient"]["refusals"] == 0, levels["patient"]["statuses"]
    assert 64 <= levels["stated"]["clients"] <= 256
    assert set(levels["stated"]["statuses"]) <= {"200", "504", "client_timeout"}
    for level in levels.values():
        assert set(level["cores"]) == {"frontend", "workers", "load_generator"}
        assert level["cores"]["workers"] > 0 and level["cores"]["load_generator"] > 0
    assert set(result["bars"]) == {
        "patient_refusals",
        "stated_share_of_patient",
        "stated_vs_unstated_goodput",
        "forwarded_late",
    }
