"""The suite's shuffled order (BERT_SERVE_TEST_ORDER_SEED, docs/testing.md)."""

from __future__ import annotations

from tests.conftest import shuffled_by_module

ITEMS = [f"{module}::{test}" for module in "abcdef" for test in range(6)]


def module_of(item: str) -> str:
    return item.split("::")[0]


def test_a_seed_shuffles_modules_and_tests_and_keeps_each_module_together() -> None:
    shuffled = shuffled_by_module(ITEMS, module_of, 7)
    assert sorted(shuffled) == sorted(ITEMS) and shuffled != ITEMS
    modules = [module_of(item) for item in shuffled]
    runs = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    assert sorted(runs) == list("abcdef") and runs != list("abcdef")
    assert any(
        [item for item in shuffled if module_of(item) == m]
        != [item for item in ITEMS if module_of(item) == m]
        for m in "abcdef"
    )


def test_the_same_seed_gives_the_same_order_and_another_another() -> None:
    assert shuffled_by_module(ITEMS, module_of, 3) == shuffled_by_module(ITEMS, module_of, 3)
    assert shuffled_by_module(ITEMS, module_of, 3) != shuffled_by_module(ITEMS, module_of, 4)
