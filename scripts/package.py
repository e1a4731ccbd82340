"""Package a Hugging Face sequence-classification folder and the handler as a .mar.

The archive holds ``bert_handler.py`` (TorchServe's entry point), the ``handler`` package
itself (the same files the unit tests import) under ``handler/``, the model under
``model/`` (config, safetensors weights, tokenizer: never pickled weights) and
``config/model-config.yaml`` as the model config.

    python scripts/package.py --model-dir build/bert-sentiment
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
HANDLER_DIR = ROOT / "handler"
MODEL_CONFIG = ROOT / "config" / "model-config.yaml"
MODEL_NAME = "bert"
MODEL_VERSION = "1.0"
PICKLED_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".h5", ".msgpack"}
BATCH_KEYS = {"batchSize", "maxBatchDelay", "minWorkers", "maxWorkers"}


def check_model_dir(model_dir: Path) -> None:
    """Fail early, with the reason, on a folder TorchServe could not serve."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise SystemExit(f"{model_dir}: no config.json; expected a Hugging Face model folder")
    if not list(model_dir.glob("*.safetensors")):
        raise SystemExit(f"{model_dir}: no .safetensors weights (pickled weights are not accepted)")
    if not (model_dir / "tokenizer.json").is_file() and not (model_dir / "vocab.txt").is_file():
        raise SystemExit(f"{model_dir}: no tokenizer (tokenizer.json or vocab.txt)")
    config = json.loads(config_file.read_text())
    architectures = config.get("architectures") or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise SystemExit(
            f"{model_dir}: architectures {architectures} has no *ForSequenceClassification"
        )
    if not config.get("id2label"):
        raise SystemExit(f"{model_dir}: config.json has no id2label")


def check_model_config(path: Path) -> None:
    """Batch settings live in config.properties only; a copy here would silently win."""
    document = yaml.safe_load(path.read_text()) or {}
    duplicated = sorted(BATCH_KEYS & set(document))
    if duplicated:
        raise SystemExit(
            f"{path}: {duplicated} belong in config/config.properties, not the model config"
        )


def stage(model_dir: Path, staging: Path) -> None:
    shutil.copytree(
        HANDLER_DIR, staging / "handler", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    (staging / "model").mkdir()
    for item in sorted(model_dir.iterdir()):
        if item.is_file() and item.suffix not in PICKLED_SUFFIXES:
            shutil.copy2(item, staging / "model" / item.name)


def archiver_command() -> str:
    """The archiver installed beside this Python, so a venv works without being activated."""
    return (
        shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent))
        or "torch-model-archiver"
    )


def package(model_dir: Path, export_path: Path, model_config: Path = MODEL_CONFIG) -> Path:
    check_model_dir(model_dir)
    check_model_config(model_config)
    export_path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bert-mar-") as temp:
        staging = Path(temp) / "extra"
        staging.mkdir()
        stage(model_dir, staging)
        subprocess.run(
            [
                archiver_command(),
                "--model-name",
                MODEL_NAME,
                "--version",
                MODEL_VERSION,
                "--handler",
                str(HANDLER_DIR / "bert_handler.py"),
                "--extra-files",
                str(staging),
                "--config-file",
                str(model_config),
                "--export-path",
                str(export_path),
                "--force",
            ],
            check=True,
        )
    return export_path / f"{MODEL_NAME}.mar"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", type=Path, required=True, help="Hugging Face sequence-classification folder"
    )
    parser.add_argument("--export-path", type=Path, default=ROOT / "model_store")
    args = parser.parse_args()
    archive = package(args.model_dir.resolve(), args.export_path.resolve())
    print(f"packaged {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
