"""The reference profile computed at packaging time: per head, from the user's texts, with the
handler's own classify, packed in the .mar where the worker reads it."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from bert_serve_server.archive import (
    MODEL_CONFIG,
    package,
    read_texts,
    reference_profile,
    source_record,
)

from handler.metrics import PROFILE_FILE, Profile

TEXTS = ["a fine film", "dull and long", "I would watch it again", "no", "a b c d e f g"]


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reference") / "texts.txt"
    path.write_text("\n".join([*TEXTS, "", "first text\tits pair"]) + "\n")
    return path


def test_one_text_a_line_and_a_tab_makes_a_pair(texts_file: Path) -> None:
    assert read_texts(texts_file) == [*TEXTS, ("first text", "its pair")]


@pytest.mark.parametrize("kind", ["single_label", "multi_label", "one_logit", "regression"])
def test_each_head_gets_the_profile_its_metrics_compare_with(
    head_model_dir: Callable[..., Path], texts_file: Path, kind: str
) -> None:
    found = Profile.from_json(reference_profile(head_model_dir(kind), MODEL_CONFIG, texts_file))
    assert found.texts == len(TEXTS) + 1 and found.head == kind
    assert found.tokens_mean > 2
    if kind == "regression":
        assert found.label_shares == {} and found.uncertainty_mean is None
        assert found.value_mean is not None
        return
    assert found.value_mean is None
    assert found.uncertainty_mean is not None and 0.0 <= found.uncertainty_mean <= 1.0
    if kind == "single_label":
        assert sum(found.label_shares.values()) == pytest.approx(1.0, abs=1e-5)


def test_the_archive_carries_the_profile_and_its_source(
    head_model_dir: Callable[..., Path], texts_file: Path, tmp_path: Path
) -> None:
    model_dir = head_model_dir("single_label")
    archive = package(model_dir, tmp_path, MODEL_CONFIG, reference=texts_file, checked=True)
    with zipfile.ZipFile(archive) as mar:
        packed = Profile.from_json(mar.read(PROFILE_FILE).decode())
        source = json.loads(mar.read("mar-source.json"))
    assert packed.texts == len(TEXTS) + 1
    assert source == json.loads(source_record(model_dir, MODEL_CONFIG, reference=texts_file))
    assert "reference_sha256" in source
    assert "reference_sha256" not in json.loads(source_record(model_dir, MODEL_CONFIG))


def test_texts_the_server_would_refuse_are_refused_here(
    head_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    too_long = tmp_path / "long.txt"
    too_long.write_text("x" * 20_000 + "\n")
    with pytest.raises(SystemExit, match="max_chars"):
        reference_profile(head_model_dir("single_label"), MODEL_CONFIG, too_long)
