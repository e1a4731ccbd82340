"""config.properties read as TorchServe's java.util.Properties reads it, and written so that
it reads back the same (bert_serve_server/config.py); the shipped models= entry, which a plain
`torchserve --start` serves as written and the project's start sizes where it says
(``sizedAtStart``)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from bert_serve_server import probe, rules, sizing
from bert_serve_server.config import (
    BASE_CONFIG,
    MODEL_NAME,
    MODEL_VERSION,
    SIZABLE_KEYS,
    SIZED_AT_START,
    configured_model,
    effective_properties,
    models_entry,
    models_entry_problems,
    parse_properties,
    properties_text,
    read_models,
    read_properties,
    stated_entry,
    with_stated_values,
)
from bert_serve_server.rules import Machine, SizingError
from bert_serve_server.sizing import sized_at_start


def test_continuation_lines_as_torchserve_documents_models() -> None:
    """models={\\ across lines: each line's trailing backslash joins the next, whose leading
    blanks are dropped."""
    text = (
        "models={\\\n"
        '  "bert": {\\\n'
        '    "1.0": {"marName": "bert.mar", "batchSize": 4}\\\n'
        "  }\\\n"
        "}\n"
    )
    models = json.loads(parse_properties(text)["models"])
    assert models == {"bert": {"1.0": {"marName": "bert.mar", "batchSize": 4}}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=b", {"a": "b"}),
        ("a = b", {"a": "b"}),
        ("a:b", {"a": "b"}),
        ("a : b", {"a": "b"}),
        ("a b", {"a": "b"}),
        ("a", {"a": ""}),
        ("a=b=c", {"a": "b=c"}),
        ("a\\=b=c", {"a=b": "c"}),
        ("a=x\\ty\\u00e9\\q", {"a": "x\tyéq"}),
        ("a=\\\\", {"a": "\\"}),
        ("a=x\\\\\nb=y", {"a": "x\\", "b": "y"}),
        ("# c=d\n! e=f\n\n  g=h", {"g": "h"}),
        ("a=1\na=2", {"a": "2"}),
        ("a=one \\\n   two", {"a": "one two"}),
        ("a=\\ud83d\\ude00", {"a": "\U0001f600"}),
    ],
)
def test_java_properties_syntax(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


def test_a_malformed_unicode_escape_is_refused() -> None:
    with pytest.raises(ValueError, match="uxxxx"):
        parse_properties("a=\\u12")


def test_what_is_written_reads_back_the_same() -> None:
    properties = {
        "plain": "value",
        "k=ey: x": "v",
        "backslash": "C:\\path\\to",
        "lead": "  two blanks",
        "comment": "#not a comment",
        "lines": "a\nb\tc",
        "unicode": "é ☃ \U0001f600",
    }
    assert parse_properties(properties_text(properties)) == properties


def test_the_shipped_config_reads_as_before(tmp_path: Path) -> None:
    """The shipped file has no escapes or continuations: every key reads as its line."""
    properties = read_properties(BASE_CONFIG)
    assert properties["allowed_urls"] == "(?!)"
    assert properties["vmargs"] == (
        "-Dlog4j.configurationFile=config/log4j2.xml -XX:+ExitOnOutOfMemoryError"
    )
    assert "bert" in read_models(BASE_CONFIG)
    copy = tmp_path / "copy.properties"
    copy.write_text(properties_text(properties))
    assert read_properties(copy) == properties


def test_read_models_of_a_config_without_models_is_empty(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("model_store=x\n")
    assert read_models(config) == {}


def shipped_entry() -> dict[str, Any]:
    return dict(read_models(BASE_CONFIG)[MODEL_NAME][MODEL_VERSION])


def test_the_shipped_entry_is_a_plain_start_that_fits_any_machine() -> None:
    """`torchserve --start` of the file as it ships serves TorchServe's default workers (one
    per CPU or GPU, each on one torch thread: handler/settings.py), batched up to the largest
    batch the project's start chooses from, which the project's start sizes itself."""
    entry = shipped_entry()
    assert "minWorkers" not in entry and "maxWorkers" not in entry
    assert entry["batchSize"] == max(rules.BATCH_SIZES) > 1
    assert entry[SIZED_AT_START] == {"batchSize": entry["batchSize"]}
    assert set(entry[SIZED_AT_START]) <= set(SIZABLE_KEYS)
    assert models_entry_problems(read_properties(BASE_CONFIG)["models"]) == []
    assert configured_model() == {"defaultVersion": True, "marName": "bert.mar", "maxBatchDelay": 1}


def test_what_is_still_the_plain_starts_is_taken_out_and_said_so() -> None:
    """A value still equal to the one sizedAtStart records is the start's to size; one changed
    since (by hand or by a tool) is stated, and so is everything an entry does not record."""
    plain = {"marName": "a.mar", "minWorkers": 1, "maxWorkers": 1, "batchSize": 64}
    record = {SIZED_AT_START: {"minWorkers": 1, "batchSize": 64}}
    models = {
        "a": {"1": plain | record, "2": plain | {"batchSize": 16} | record},
        "b": {"1": plain},
    }
    properties, notes = sized_at_start({"models": json.dumps(models), "other": "x"})
    assert json.loads(properties["models"]) == {
        "a": {
            "1": {"marName": "a.mar", "maxWorkers": 1},
            "2": {"marName": "a.mar", "maxWorkers": 1, "batchSize": 16},
        },
        "b": {"1": plain},
    }, "maxWorkers stays stated (a cap), batchSize 16 too; b records nothing: all stated"
    assert properties["other"] == "x"
    assert notes == [
        "a:1: config.properties' minWorkers 1, batchSize 64 (sizedAtStart) is what a plain "
        "torchserve --start serves: sized here",
        "a:2: config.properties' minWorkers 1 (sizedAtStart) is what a plain torchserve "
        "--start serves: sized here",
        "a:2: batchSize 16: changed from sizedAtStart's, stated",
    ]
    assert sized_at_start({"models": json.dumps({"b": {"1": plain}})})[1] == []


@pytest.mark.parametrize("record", [{"minWorker": 1}, {"maxBatchDelay": 1}, ["batchSize"]])
def test_a_record_of_what_the_start_does_not_size_is_refused(record: object) -> None:
    """A misspelt name would leave its value stated without a word."""
    models = {"a": {"1": {"batchSize": 8, SIZED_AT_START: record}}}
    with pytest.raises(SizingError, match="sizedAtStart"):
        sized_at_start({"models": json.dumps(models)})


def test_values_the_tools_state_leave_sized_at_start() -> None:
    """models_entry(...) states what it is given, even the plain start's own 64; what it is
    not given stays the start's to size."""
    for size in (1, 64):
        (entry,) = json.loads(models_entry(batch_size=size))[MODEL_NAME].values()
        assert entry["batchSize"] == size and SIZED_AT_START not in entry
        assert stated_entry(entry)["batchSize"] == size
    (entry,) = json.loads(models_entry(workers=2))[MODEL_NAME].values()
    assert entry["minWorkers"] == 2 and "batchSize" not in stated_entry(entry)
    marked = {"batchSize": 64, "minWorkers": 1, SIZED_AT_START: {"minWorkers": 1, "batchSize": 64}}
    assert with_stated_values(marked, {"minWorkers": 1}) == {
        "batchSize": 64,
        "minWorkers": 1,
        SIZED_AT_START: {"batchSize": 64},
    }
    assert json.loads(models_entry())[MODEL_NAME][MODEL_VERSION] == shipped_entry()


def test_the_project_start_sizes_the_shipped_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an 8-core machine the start derives 8 workers (the file states none) and a measured
    batch size in place of the file's plain-start one, and says which value that was."""
    mib = 2**20
    with zipfile.ZipFile(tmp_path / "bert.mar", "w") as archive:
        archive.writestr("model/config.json", "{}")
    worker = probe.WorkerMemory(peak_bytes=640 * mib, uss_bytes=600 * mib, pss_bytes=620 * mib)
    rates = {size: 10.0 * size for size in rules.BATCH_SIZES} | {64: 10.0 * 33}
    monkeypatch.setattr(sizing, "read_machine", lambda gpus: Machine(8, 16 * 2**30, gpus))
    monkeypatch.setattr(sizing, "measured_rates", lambda *args: rates)
    fp32 = probe.PrecisionChoice("fp32", "fp32: not measured in this test")
    monkeypatch.setattr(sizing, "measured_precision", lambda *args: fp32)
    monkeypatch.setattr(sizing, "measured_memory", lambda *args, **kwargs: worker)
    resolved = sizing.resolve(effective_properties({"model_store": str(tmp_path)}), gpus=0)
    (entry,) = json.loads(resolved.properties["models"])[MODEL_NAME].values()
    assert (entry["minWorkers"], entry["maxWorkers"], resolved.torch_threads) == (8, 8, 1)
    assert entry["batchSize"] == 32 and SIZED_AT_START not in entry
    assert "workers: stated" not in resolved.reasons
    assert any("(sizedAtStart)" in reason for reason in resolved.reasons)
