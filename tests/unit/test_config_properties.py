"""config.properties read as TorchServe's java.util.Properties reads it, and written so that
it reads back the same (bert_serve_server/config.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bert_serve_server.config import (
    BASE_CONFIG,
    parse_properties,
    properties_text,
    read_models,
    read_properties,
)


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
