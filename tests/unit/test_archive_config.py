"""The start reads an archive's handler settings from the file its manifest names: the archiver
packs a variant's config as ``NAME.mar.model-config.yaml`` (``make serve PRECISION=bf16``, the
GPU report's stores), and measuring such an archive with the defaults timed fp32 for a bf16
model and placed a ``device: cpu`` model on the GPU."""

from __future__ import annotations

from pathlib import Path

from bert_serve_server.archive import (
    DEFAULT_ARCHIVE,
    DEFAULT_MODEL_DIR,
    fresh_default_archive,
    package_variant,
)
from bert_serve_server.probe import archive_handler_config
from bert_serve_server.rules import Machine
from bert_serve_server.sizing import archive_limits, runs_on_gpu

GIB = 2**30


def test_a_variant_archive_is_read_with_its_own_settings(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    stated = {"precision": "bf16", "device": "cpu", "max_chars": 1234, "max_texts_per_request": 7}
    mar = package_variant(tmp_path / "variant", handler_changes=stated, model_dir=tiny_model_dir)
    handler = archive_handler_config(mar)
    assert {key: handler[key] for key in stated} == stated
    assert archive_limits(mar) == (1234, 7)
    assert not runs_on_gpu(Machine(8, 16 * GIB, gpus=1), mar)
    default = package_variant(tmp_path / "default", model_dir=tiny_model_dir)
    assert archive_handler_config(default)["precision"] == "auto"
    assert runs_on_gpu(Machine(8, 16 * GIB, gpus=1), default)


def test_the_default_model_unchanged_is_a_copy_of_make_packages_archive(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The tools' stores of the default model (the floor's, the models-share run's) copy the
    archive `make package` built, byte for byte, so a test run measures it once; a change or
    another model is packaged anew."""
    assert fresh_default_archive(DEFAULT_MODEL_DIR) == DEFAULT_ARCHIVE, "make package first"
    copy = package_variant(tmp_path / "store")
    assert copy.read_bytes() == DEFAULT_ARCHIVE.read_bytes()
    assert fresh_default_archive(tiny_model_dir) is None
