"""lab/tune.py: the candidates make tune measures follow the cores it runs on."""

from __future__ import annotations

import pytest

from lab.tune import candidate_name, default_candidates, parse_candidate


def test_two_cores_give_the_default_layout_and_one_worker_with_both() -> None:
    assert default_candidates(2) == [
        "b1d0w2t1",
        "b4d1w2t1",
        "b8d1w2t1",
        "b16d1w2t1",
        "b16d2w2t1",
        "b32d2w2t1",
        "b16d1w1t2",
    ]


def test_many_cores_add_half_the_workers_with_two_threads_and_one_with_all() -> None:
    names = default_candidates(16.5)  # a fractional cgroup quota rounds down
    assert names[:6] == [
        f"b{b}d{d}w16t1" for b, d in ((1, 0), (4, 1), (8, 1), (16, 1), (16, 2), (32, 2))
    ]
    assert names[6:] == ["b16d1w8t2", "b16d1w1t16"]


def test_one_core_has_no_other_layout() -> None:
    assert (
        default_candidates(1)
        == default_candidates(0.5)
        == [f"b{b}d{d}w1t1" for b, d in ((1, 0), (4, 1), (8, 1), (16, 1), (16, 2), (32, 2))]
    )


@pytest.mark.parametrize("name", default_candidates(16))
def test_every_default_candidate_parses_back_to_its_name(name: str) -> None:
    assert candidate_name(parse_candidate(name)) == name
