"""A folder that cannot be served is refused, with its reason and fix, before packaging and at start.

``handler.model_check.inspect_folder`` is the one check: ``bert_serve_server.archive`` runs it before
archiving (and ``make serve`` through ``--stamp-only``), ``load_model`` runs it at worker start.
Each broken folder is a copy of a good tiny one (tests/architectures.py) with one thing wrong.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from handler.model import load_model
from handler.model_check import PADDING_TOLERANCE, ModelRefused, inspect_folder, padding_difference
from handler.settings import HandlerSettings
from tests.architectures import ARCHITECTURES
from tests.conftest import ROOT


def broken_copy(source: Path, target: Path, change: Callable[[Path], None]) -> Path:
    shutil.copytree(source, target)
    change(target)
    return target


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def pickled_only(folder: Path) -> None:
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def no_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()


def masked_lm(folder: Path) -> None:
    edit_json(folder / "config.json", architectures=["BertForMaskedLM"])


def pads_with_bos(folder: Path) -> None:
    edit_json(folder / "tokenizer_config.json", pad_token="<s>")


BROKEN: dict[str, tuple[str, Callable[[Path], None], str, str]] = {
    "pickled weights only": ("bert", pickled_only, "no *.safetensors", "safe_serialization=True"),
    "no tokenizer": ("bert", no_tokenizer, "no tokenizer files", "save_pretrained"),
    "not a sequence classifier": (
        "bert",
        masked_lm,
        "is not a sequence classifier",
        "*ForSequenceClassification",
    ),
    "tokenizer pad is not the model's": (
        "roberta",
        pads_with_bos,
        "pads with id 0 ('<s>') but config.json's pad_token_id is 1",
        "pad ids agree",
    ),
}


@pytest.fixture(scope="module")
def broken(architecture_dir, tmp_path_factory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in made:
            source, change, _, _ = BROKEN[case]
            target = tmp_path_factory.mktemp("broken") / case.replace(" ", "-")
            made[case] = broken_copy(architecture_dir(source), target, change)
        return made[case]

    return get


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_passes(architecture_dir, name: str) -> None:
    inspection = inspect_folder(architecture_dir(name), HandlerSettings())
    assert inspection.problems == []
    assert inspection.attention is not None
    assert inspection.attention.implementation == ARCHITECTURES[name].attention


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_folder_is_refused_with_reason_and_fix(broken, case: str) -> None:
    """Each rule names what is wrong and the fix; the worker refuses with the same words."""
    _, _, reason, fix = BROKEN[case]
    problems = inspect_folder(broken(case), HandlerSettings()).problems
    assert len(problems) == 1, problems
    assert reason in problems[0].reason and fix in problems[0].fix
    with pytest.raises(ModelRefused, match="cannot be served") as refused:
        load_model(broken(case), HandlerSettings(), None)
    assert refused.value.problems == problems


def test_max_length_must_fit_the_positions_counted_after_the_pad(architecture_dir) -> None:
    """RoBERTa's 514 positions hold 512 tokens (its positions start after the pad id 1): 512
    is accepted and runs, 513 is refused; BERT's 512 positions hold 512."""
    from handler.inference import classify

    folder = architecture_dir("roberta")
    longest = HandlerSettings(max_length=512, max_batch_tokens=1024)
    assert inspect_folder(folder, longest).problems == []
    [prediction], _ = classify(load_model(folder, longest, None), ["word " * 600], 512, 1024)
    assert prediction.truncated
    over = HandlerSettings(max_length=513, max_batch_tokens=1024)
    assert [str(p) for p in inspect_folder(folder, over).problems] == [
        "max_length 513 exceeds the model's 512 positions "
        "(fix: set max_length to at most 512 in the handler config)"
    ]
    assert inspect_folder(architecture_dir("bert"), longest).problems == []


def test_attention_auto_follows_the_model_and_a_setting_forces_one(architecture_dir) -> None:
    """auto: sdpa where the class has it, eager (with the reason) where not; eager is always
    allowed; sdpa on DeBERTa-v2 is refused at once instead of failing in from_pretrained."""
    deberta, bert = architecture_dir("deberta-v2"), architecture_dir("bert")
    auto = inspect_folder(deberta, HandlerSettings()).attention
    assert auto is not None and auto.implementation == "eager"
    assert "DebertaV2ForSequenceClassification has no sdpa attention" in auto.reason
    forced = inspect_folder(bert, HandlerSettings(attention="eager"))
    assert forced.attention is not None and forced.attention.implementation == "eager"
    assert (
        load_model(bert, HandlerSettings(attention="eager"), None).model.config._attn_implementation
        == "eager"
    )
    problems = inspect_folder(deberta, HandlerSettings(attention="sdpa")).problems
    assert len(problems) == 1 and "attention is set to sdpa" in problems[0].reason
    assert "attention: auto" in problems[0].fix


def test_a_tokenizer_of_another_model_is_refused(architecture_dir, tmp_path: Path) -> None:
    """A tokenizer with more tokens than the embeddings would fail on the first rare word."""
    folder = broken_copy(architecture_dir("bert"), tmp_path / "small-vocab", lambda _: None)
    edit_json(folder / "config.json", vocab_size=100)
    inspection = inspect_folder(folder, HandlerSettings())
    assert [p.reason for p in inspection.problems] == [
        f"the tokenizer has {len(inspection.tokenizer)} tokens but the model embeds only 100"
    ]


def test_a_tokenizer_without_pad_is_refused(architecture_dir, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = broken_copy(architecture_dir("bert"), tmp_path / "no-pad", lambda _: None)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(folder)
    problems = inspect_folder(folder, HandlerSettings()).problems
    assert [p.reason for p in problems] == [
        "the tokenizer has no pad token, so texts of different lengths cannot share a batch"
    ]


def test_package_refuses_in_seconds_and_writes_nothing(broken, tmp_path: Path) -> None:
    """python -m bert_serve_server package (make package) prints every reason and its fix and exits 1 before
    the archiver runs; the same for --stamp-only (what make serve runs first)."""
    for extra in ([], ["--stamp-only"]):
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bert_serve_server",
                "package",
                "--model-dir",
                str(broken("pickled weights only")),
                "--export-path",
                str(tmp_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        elapsed = time.monotonic() - started
        assert result.returncode == 1, result.stderr
        assert "cannot be served" in result.stderr and "no *.safetensors weights" in result.stderr
        assert "fix: convert once" in result.stderr
        assert list(tmp_path.iterdir()) == []
        assert elapsed < 60, f"took {elapsed:.1f} s"


def test_package_refuses_an_attention_the_model_lacks(architecture_dir, tmp_path: Path) -> None:
    """The handler config packed beside the folder is checked with it."""
    config = tmp_path / "model-config.yaml"
    config.write_text(
        (ROOT / "config" / "model-config.yaml")
        .read_text()
        .replace("attention: auto", "attention: sdpa")
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_serve_server",
            "package",
            "--model-dir",
            str(architecture_dir("deberta-v2")),
            "--model-config",
            str(config),
            "--export-path",
            str(tmp_path / "store"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 1
    assert "attention is set to sdpa but DebertaV2ForSequenceClassification" in result.stderr
    assert not (tmp_path / "store").exists()


class IgnoresTheMask(torch.nn.Module):
    """A classifier that averages every position, padding included."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        return SimpleNamespace(logits=input_ids.float().mean(dim=1, keepdim=True))


def test_the_start_probe_sees_a_model_whose_scores_move_with_padding(architecture_dir) -> None:
    """padding_difference: a short text alone vs padded beside a long one, as the handler pads.
    Every architecture moves by less than 1e-5 (the probe refuses over 1e-3); a model that
    reads its padding moves by far more."""
    from transformers import AutoModelForSequenceClassification

    for name in ARCHITECTURES:
        folder = architecture_dir(name)
        inspection = inspect_folder(folder, HandlerSettings())
        model = AutoModelForSequenceClassification.from_pretrained(
            folder, attn_implementation=inspection.attention.implementation
        ).eval()
        moved = padding_difference(model, inspection.tokenizer, torch.device("cpu"))
        assert moved < 1e-5, f"{name}: {moved}"
    tokenizer = inspect_folder(architecture_dir("bert"), HandlerSettings()).tokenizer
    assert padding_difference(IgnoresTheMask(), tokenizer, torch.device("cpu")) > PADDING_TOLERANCE
