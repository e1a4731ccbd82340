"""Smoke run of the precision comparison tool on a tiny model and a small text file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from handler.inference import Prediction
from handler.precision import cpu_has_native_bf16
from lab.compare import flips, precision_choices
from tests.conftest import ROOT

TEXTS = ["great film", "a dull, joyless mess", "", "it was fine, I suppose " * 30, "ok"]


def prediction(label: str, positive: float) -> Prediction:
    scores = {"negative": 1 - positive, "positive": positive}
    return Prediction(label=label, score=scores[label], scores=scores, truncated=False)


def test_flips_list_changed_decisions_largest_change_first() -> None:
    exact = [
        prediction("positive", 0.51),
        prediction("negative", 0.2),
        prediction("negative", 0.45),
    ]
    fast = [
        prediction("negative", 0.49),
        prediction("negative", 0.25),
        prediction("positive", 0.55),
    ]
    changed = flips(["a", "b", "c"], exact, fast, "bf16")
    assert [item["text"] for item in changed] == ["c", "a"]
    assert changed[0]["fp32"]["labels"] == ["negative"]
    assert changed[0]["bf16"] == {"labels": ["positive"], "score": 0.55}


def test_compare_precision_smoke(tiny_model_dir: Path, tmp_path: Path) -> None:
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "compare.json"
    result = subprocess.run(
        [
            sys.executable,
            "scripts/compare_precision.py",
            "--model-dir",
            str(tiny_model_dir),
            "--texts",
            str(texts_file),
            "--seconds",
            "0",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not cpu_has_native_bf16():
        assert result.returncode == 2 and "no native bf16" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["texts"] == 4  # the blank line is skipped
    assert set(report["texts_per_s"]) == {"fp32", "bf16"}
    assert all(rate > 0 for rate in report["texts_per_s"].values())
    assert report["labels_unchanged"] + report["labels_flipped"] == 4
    assert 0 <= report["largest_score_change"] < 1
    assert "labels unchanged" in result.stdout


def test_tf32_is_a_choice_only_where_cuda_is() -> None:
    assert "tf32" in precision_choices(cuda=True)
    assert "tf32" not in precision_choices(cuda=False)
    assert "fp32" not in precision_choices(cuda=True)
    assert "bf16" in precision_choices(cuda=False)
