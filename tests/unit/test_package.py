"""The .mar serves the same handler code the tests import, and no pickled weights."""

from __future__ import annotations

import json
import zipfile

import pytest
import yaml
from bert_serve_server.config import MODEL_NAME, read_models

from tests.conftest import MAR_PATH, ROOT


@pytest.fixture(scope="module")
def archive() -> zipfile.ZipFile:
    if not MAR_PATH.is_file():
        pytest.fail(f"{MAR_PATH} is missing: run `make package` (make test does it)")
    return zipfile.ZipFile(MAR_PATH)


def test_mar_holds_the_handler_package_byte_for_byte(archive: zipfile.ZipFile) -> None:
    """Every module of handler/ is in the .mar unchanged: the served code is the tested code."""
    for source in sorted((ROOT / "handler").glob("*.py")):
        assert archive.read(f"handler/{source.name}") == source.read_bytes(), source.name
    assert archive.read("bert_handler.py") == (ROOT / "handler" / "bert_handler.py").read_bytes()


def test_mar_weights_are_safetensors_only(archive: zipfile.ZipFile) -> None:
    names = archive.namelist()
    assert "model/model.safetensors" in names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]


def test_mar_model_config_and_version_match_config_properties(archive: zipfile.ZipFile) -> None:
    """The models= entry is keyed by the .mar's version and the .mar carries no batch keys."""
    manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
    assert manifest["model"]["modelVersion"] in read_models()[MODEL_NAME]
    packed = yaml.safe_load(archive.read(manifest["model"]["configFile"]))
    assert not {"batchSize", "maxBatchDelay", "minWorkers", "maxWorkers"} & set(packed)
    assert (
        packed["handler"]
        == yaml.safe_load((ROOT / "config" / "model-config.yaml").read_text())["handler"]
    )
