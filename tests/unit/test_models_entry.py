"""The ``models=`` values TorchServe 0.12 replaces without a word are refused before start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bert_serve_server.config import (
    BASE_CONFIG,
    models_entry,
    models_entry_problems,
    read_properties,
)
from bert_serve_server.control import Server, ServerError, check_startable


def test_the_shipped_config_has_no_silently_replaced_value() -> None:
    assert models_entry_problems(read_properties(BASE_CONFIG)["models"]) == []


@pytest.mark.parametrize(
    ("key", "value", "runs_as"),
    [("maxBatchDelay", 0, 100), ("batchSize", 0, 1), ("batchSize", -4, 1)],
)
def test_a_value_of_zero_or_less_is_named_with_what_it_would_run_as(
    key: str, value: int, runs_as: int
) -> None:
    models = json.loads(models_entry())
    models["bert"]["1.0"][key] = value
    (problem,) = models_entry_problems(json.dumps(models))
    assert f"{key}={value} would run as {runs_as}" in problem


def test_a_server_with_such_a_value_is_not_started(tmp_path: Path) -> None:
    properties = read_properties(BASE_CONFIG) | {"models": models_entry(max_batch_delay=0)}
    with pytest.raises(ServerError, match="maxBatchDelay=0 would run as 100"):
        check_startable(Server(state_dir=tmp_path, properties=properties))


def test_a_batch_delay_of_zero_with_batches_of_one_is_never_waited_and_goes() -> None:
    assert models_entry_problems(models_entry(batch_size=1, max_batch_delay=0)) == []
