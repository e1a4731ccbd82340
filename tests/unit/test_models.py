"""server/bert_serve_server/config.py: MODELS parsed, archives named, and the ``models=``/
``load_models`` that serve several models and versions, the default version first; and
archive.py's ``handler_config_for``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bert_serve_server.archive import handler_config_for
from bert_serve_server.config import (
    ModelSpec,
    archive_name,
    parse_models,
    read_models,
    serving_overrides,
    single_model,
    without,
)


def test_models_are_name_optional_version_and_folder() -> None:
    specs = parse_models("sentiment=build/a  toxicity:2=/x/b sentiment:2.1=c")
    assert specs == [
        ModelSpec("sentiment", "1.0", Path("build/a")),
        ModelSpec("toxicity", "2", Path("/x/b")),
        ModelSpec("sentiment", "2.1", Path("c")),
    ]
    assert single_model(Path("m")) == [ModelSpec("bert", "1.0", Path("m"))]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("sentiment", "NAME[:VERSION]=DIR"),
        ("sentiment=", "NAME[:VERSION]=DIR"),
        ("sent/iment=a", "the name 'sent/iment'"),
        ("a:v 1=b", "NAME[:VERSION]=DIR"),
        ("a:-1=b", "the version '-1'"),
        ("a=x a:1.0=y", "a:1.0 twice"),
    ],
)
def test_bad_models_name_the_item(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_models(text)


def test_one_version_is_name_mar_and_several_are_told_apart() -> None:
    specs = parse_models("s=a s:2=b t:3=c")
    assert [archive_name(spec, specs) for spec in specs] == ["s-v1.0.mar", "s-v2.mar", "t.mar"]


def test_overrides_load_the_default_first_and_keep_the_configs_settings() -> None:
    """Each model takes the config's entry for its name and version, else its first entry's
    settings; the default is the marked version, else the first listed, and loads first."""
    configured = {
        "bert": {"1.0": {"defaultVersion": True, "marName": "bert.mar", "maxBatchDelay": 1}},
        "s": {"2": {"defaultVersion": True, "maxBatchDelay": 7, "batchSize": 4}},
    }
    specs = parse_models("s:1=a s:2=b t=c")
    overrides = serving_overrides(specs, configured)
    assert overrides["load_models"] == "s-v2.mar,t.mar,s-v1.mar"
    assert json.loads(overrides["models"]) == {
        "s": {
            "1": {"defaultVersion": False, "marName": "s-v1.mar", "maxBatchDelay": 1},
            "2": {
                "defaultVersion": True,
                "marName": "s-v2.mar",
                "maxBatchDelay": 7,
                "batchSize": 4,
            },
        },
        "t": {"1.0": {"defaultVersion": True, "marName": "t.mar", "maxBatchDelay": 1}},
    }
    unmarked = serving_overrides(parse_models("s:1=a s:3=b"), configured)
    assert unmarked["load_models"] == "s-v1.mar,s-v3.mar"


def test_the_shipped_config_serves_bert_as_it_did() -> None:
    overrides = serving_overrides(single_model(Path("m")), read_models())
    assert overrides["load_models"] == "bert.mar"
    assert json.loads(overrides["models"]) == read_models()


def test_a_refused_model_leaves_the_others_and_its_name_keeps_a_default() -> None:
    properties = serving_overrides(parse_models("s:1=a s:2=b t=c"), {}) | {"x": "y"}
    kept = without(properties, {"s:1": "cannot load", "t:1.0": "missing"})
    assert kept["load_models"] == "s-v2.mar"
    assert json.loads(kept["models"]) == {
        "s": {"2": {"defaultVersion": True, "marName": "s-v2.mar"}}
    }
    assert kept["x"] == "y"


def test_a_models_own_handler_config_is_used_where_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bert_serve_server import archive

    monkeypatch.setattr(archive, "PER_MODEL_CONFIG_DIR", tmp_path)
    (tmp_path / "toxicity.yaml").write_text("handler: {}\n")
    default = Path("default.yaml")
    assert handler_config_for("toxicity", default) == tmp_path / "toxicity.yaml"
    assert handler_config_for("sentiment", default) == default
