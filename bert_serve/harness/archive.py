""".mar variants: the default model packaged with a changed model config, in a store of its own.

Packaging itself is ``scripts/package.py``'s ``package()`` (what ``make package`` runs); it is
loaded from its file here so that the tuner and the tests call that very function.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from bert_serve.harness.config import ROOT

PACKAGE_SCRIPT = ROOT / "scripts" / "package.py"
DEFAULT_MODEL_DIR = ROOT / "build" / "bert-sentiment"


def package_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bert_serve_package_script", PACKAGE_SCRIPT)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {PACKAGE_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_variant(
    store: Path,
    changes: dict[str, Any] | None = None,
    handler_changes: dict[str, Any] | None = None,
    model_dir: Path = DEFAULT_MODEL_DIR,
) -> Path:
    """Package ``model_dir`` into ``store`` with config/model-config.yaml changed: ``changes``
    at its top level (e.g. responseTimeout), ``handler_changes`` in its ``handler:`` section."""
    script = package_script()
    config = yaml.safe_load(Path(script.MODEL_CONFIG).read_text())
    config |= changes or {}
    config["handler"] = config["handler"] | (handler_changes or {})
    store.mkdir(parents=True, exist_ok=True)
    config_file = store / "model-config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return Path(script.package(model_dir, store, config_file))
