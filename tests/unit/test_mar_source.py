"""The .mar follows the model folder and handler config it was built from, not file times.

``make serve MODEL_DIR=X`` used to keep serving the last packaged model whenever the .mar was
newer than X/config.json. The .mar now records its source (``mar-source.json``) and the
Makefile rebuilds it whenever that record changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from bert_serve_server.archive import (
    MODEL_CONFIG,
    SOURCE_FILE,
    default_reference,
    source_record,
    stamp_for,
)

from tests.conftest import MAR_PATH, REAL_MODEL_DIR, ROOT


def recorded_source(archive: Path) -> dict:
    with zipfile.ZipFile(archive) as mar:
        return json.loads(mar.read(SOURCE_FILE))


def test_the_packaged_mar_is_built_from_the_default_model_and_config() -> None:
    """The suite tests model_store/bert.mar as the default model: a .mar packaged from another
    folder, or from an older state of this one or of the handler config, is stale."""
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    recorded = recorded_source(MAR_PATH)
    reference = default_reference(REAL_MODEL_DIR)
    assert reference is not None, "make package writes the default model's reference texts"
    current = json.loads(source_record(REAL_MODEL_DIR, MODEL_CONFIG, reference=reference))
    assert recorded == current, (
        f"{MAR_PATH} is stale: built from {recorded['model_dir']} "
        f"(config {recorded['model_config']}); run `make package`"
    )


def make_mar(
    archive: Path, model_dir: Path, model_config: Path = MODEL_CONFIG, precision: str = ""
) -> str:
    """``make <archive>`` with this model folder, handler config and PRECISION; its output."""
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            str(archive),
            f"MAR={archive}",
            f"MODEL_DIR={model_dir}",
            f"MODEL_CONFIG={model_config}",
            f"PRECISION={precision}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def age(folder: Path, seconds: float) -> None:
    """Make every file of the folder look ``seconds`` old."""
    then = time.time() - seconds
    for item in folder.iterdir():
        os.utime(item, (then, then))


def test_make_repackages_when_the_source_changes(
    head_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """Another model folder, even one whose files are older than the .mar, or an edited handler
    config, repackages; nothing changed, nothing is rebuilt."""
    archive = tmp_path / "store" / "bert.mar"
    first = shutil.copytree(head_model_dir("multi_label"), tmp_path / "multi-label")
    second = shutil.copytree(head_model_dir("pair"), tmp_path / "pair")
    age(second, 86_400)

    assert "packaged" in make_mar(archive, first)
    assert recorded_source(archive)["model_dir"] == str(first)
    assert "packaged" not in make_mar(archive, first), "rebuilt with nothing changed"

    assert "packaged" in make_mar(archive, second), "an older model folder was not packaged"
    assert recorded_source(archive)["model_dir"] == str(second)
    with zipfile.ZipFile(archive) as mar:
        packed_config = json.loads(mar.read("model/config.json"))
    assert packed_config["id2label"]["0"] == "entailment"

    config = tmp_path / "model-config.yaml"
    config.write_text(MODEL_CONFIG.read_text().replace("max_length: 128", "max_length: 64"))
    age(tmp_path, 86_400)
    assert "packaged" in make_mar(archive, second, config), "an edited config was not packaged"
    assert "packaged" not in make_mar(archive, second, config)

    (second / "config.json").write_text((second / "config.json").read_text() + "\n")
    age(second, 3 * 86_400)
    assert "packaged" in make_mar(archive, second, config), "a changed model file was not packaged"
    assert stamp_for(archive).read_text() == source_record(second, config)


def packed_handler_settings(archive: Path) -> dict:
    with zipfile.ZipFile(archive) as mar:
        config_file = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]["configFile"]
        return dict(yaml.safe_load(mar.read(config_file))["handler"])


def test_make_precision_packages_that_precision_and_back(
    head_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """``make serve PRECISION=fp32`` serves a .mar whose handler config says fp32; the same
    make without PRECISION repackages the config as written (auto)."""
    archive = tmp_path / "store" / "bert.mar"
    model_dir = head_model_dir("single_label")
    assert "packaged" in make_mar(archive, model_dir)
    assert packed_handler_settings(archive)["precision"] == "auto"

    assert "packaged" in make_mar(archive, model_dir, precision="fp32")
    settings = packed_handler_settings(archive)
    written = yaml.safe_load(MODEL_CONFIG.read_text())["handler"]
    assert settings == written | {"precision": "fp32"}
    assert "packaged" not in make_mar(archive, model_dir, precision="fp32")

    assert "packaged" in make_mar(archive, model_dir), "switching back to auto did not repackage"
    assert packed_handler_settings(archive)["precision"] == "auto"


def test_packagings_at_the_same_time_do_not_mix(
    head_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """torch-model-archiver stages every "bert" archive in $TMPDIR/bert: without a TMPDIR of
    its own, concurrent runs (tests, the lab, another checkout) fail or pack each other's files."""
    from concurrent.futures import ThreadPoolExecutor

    from bert_serve_server.archive import package

    kinds = ["multi_label", "pair", "regression", "one_logit"] * 2
    jobs = [(head_model_dir(kind), tmp_path / f"store-{i}") for i, kind in enumerate(kinds)]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        archives = list(pool.map(lambda job: package(*job), jobs))
    for (model_dir, _), archive in zip(jobs, archives, strict=True):
        with zipfile.ZipFile(archive) as mar:
            assert mar.read("model/config.json") == (model_dir / "config.json").read_bytes()
            assert recorded_source(archive)["model_dir"] == str(model_dir)


def test_make_checks_the_folder_once_and_stores_the_weights(
    head_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """make's .mar recipe packages with --checked (its --stamp-only step has just run the
    folder check, which imports torch and transformers), and the archive stores its entries
    rather than deflating them: deflating the weights took most of the archiver's time."""
    archive = tmp_path / "store" / "bert.mar"
    output = make_mar(archive, head_model_dir("single_label"))
    assert "--stamp-only" not in output  # silent (@) in the Makefile
    assert "--checked" in output
    with zipfile.ZipFile(archive) as mar:
        kinds = {info.filename: info.compress_type for info in mar.infolist()}
    assert kinds["model/model.safetensors"] == zipfile.ZIP_STORED
    assert set(kinds.values()) == {zipfile.ZIP_STORED}


def test_an_unchanged_source_is_checked_once(
    head_model_dir: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--stamp-only (every make of the .mar) checks the folder again only where the source, or
    the handler's code that checks it, changed since the archive was packaged."""
    from bert_serve_server import archive as package_cli

    archive = tmp_path / "store" / "bert.mar"
    model_dir = head_model_dir("single_label")
    make_mar(archive, model_dir)
    checks: list[Path] = []
    monkeypatch.setattr(package_cli, "check_model_dir", lambda folder, _: checks.append(folder))
    stamp_only = [
        "--model-dir",
        str(model_dir),
        "--export-path",
        str(archive.parent),
        "--stamp-only",
    ]
    assert package_cli.main(stamp_only) == 0 and checks == []

    os.utime(archive, (0, 0))  # packaged before the handler's code last changed
    assert package_cli.main(stamp_only) == 0 and checks == [model_dir]
    make_mar(archive, model_dir)
    config = tmp_path / "model-config.yaml"
    config.write_text(MODEL_CONFIG.read_text().replace("max_length: 128", "max_length: 64"))
    assert package_cli.main([*stamp_only, "--model-config", str(config)]) == 0
    assert checks == [model_dir, model_dir]


def test_make_refuses_a_folder_that_cannot_be_served(tmp_path: Path) -> None:
    """--checked skips only a check that --stamp-only, which make always runs first, passed:
    a folder without weights still stops make before anything is archived."""
    folder = tmp_path / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    archive = tmp_path / "store" / "bert.mar"
    result = subprocess.run(
        ["make", "--no-print-directory", str(archive), f"MAR={archive}", f"MODEL_DIR={folder}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "cannot be served" in result.stderr and "no *.safetensors weights" in result.stderr
    assert not archive.exists()
