"""Several models on one server: which folders, under which names and versions, in which files.

``make serve MODELS="sentiment=DIR toxicity:2=DIR2"`` names each model ``NAME[:VERSION]=DIR``
(version ``1.0`` when left out). One name may be listed with several versions: all of them are
loaded, each at ``/predictions/NAME/VERSION``, and ``/predictions/NAME`` answers the default
one. The default of a name is the version that config.properties' ``models=`` marks
``"defaultVersion": true``, else the first listed.

From that list this module derives what TorchServe reads at start (``serving_overrides``):
``load_models`` (the default versions first: TorchServe 0.12 makes the first version it
registers the default, and reads ``defaultVersion`` only when it restores a snapshot) and a
``models=`` entry per name and version. Each entry is the config's own entry for that name and
version where it has one, else the settings of the config's first entry (batch delay, workers,
batch size: what the config states for its model applies to every model it does not name).

A model's archive is ``model_store/NAME.mar``, or ``NAME-vVERSION.mar`` when several versions
of NAME are served. Its handler settings are ``config/models/NAME.yaml`` where that exists,
else ``config/model-config.yaml``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_serve_server.config import MODEL_NAME, MODEL_VERSION, ROOT

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
"""What TorchServe accepts as a model name (and what we accept as a version)."""
PER_MODEL_CONFIG_DIR = ROOT / "config" / "models"
DEFAULT_MODEL_CONFIG = ROOT / "config" / "model-config.yaml"
ENTRY_ONLY_KEYS = ("marName", "defaultVersion")
"""Keys of a ``models=`` entry that describe that entry's archive, never copied to another."""


@dataclass(frozen=True)
class ModelSpec:
    """One model version to serve: its name, version and Hugging Face folder."""

    name: str
    version: str
    model_dir: Path

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}"


def parse_models(text: str) -> list[ModelSpec]:
    """``NAME[:VERSION]=DIR`` items separated by spaces; ValueError naming the bad item."""
    specs: list[ModelSpec] = []
    for item in text.split():
        label, separator, folder = item.partition("=")
        name, _, version = label.partition(":")
        version = version or MODEL_VERSION
        if not separator or not folder:
            raise ValueError(f"MODELS item {item!r}: expected NAME[:VERSION]=DIR")
        for what, value in (("name", name), ("version", version)):
            if not NAME_PATTERN.fullmatch(value):
                raise ValueError(
                    f"MODELS item {item!r}: the {what} {value!r} must be letters, digits, "
                    "'_', '-' or '.', starting with a letter or digit"
                )
        spec = ModelSpec(name, version, Path(folder))
        if any(other.key == spec.key for other in specs):
            raise ValueError(f"MODELS lists {spec.key} twice")
        specs.append(spec)
    if not specs:
        raise ValueError("MODELS is empty: expected NAME[:VERSION]=DIR items")
    return specs


def single_model(model_dir: Path) -> list[ModelSpec]:
    """What ``make serve MODEL_DIR=...`` serves: one model named ``bert``."""
    return [ModelSpec(MODEL_NAME, MODEL_VERSION, model_dir)]


def archive_name(spec: ModelSpec, specs: Sequence[ModelSpec]) -> str:
    versions = sum(other.name == spec.name for other in specs)
    return f"{spec.name}.mar" if versions == 1 else f"{spec.name}-v{spec.version}.mar"


def handler_config_for(name: str, default: Path = DEFAULT_MODEL_CONFIG) -> Path:
    """``config/models/NAME.yaml`` where it exists (precision, limits, deadline budget of that
    model), else ``default``."""
    own = PER_MODEL_CONFIG_DIR / f"{name}.yaml"
    return own if own.is_file() else default


def default_versions(
    specs: Sequence[ModelSpec], configured: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, str]:
    """Each name's default version: the one the config marks, else the first listed."""
    defaults: dict[str, str] = {}
    for spec in specs:
        marked = configured.get(spec.name, {}).get(spec.version, {}).get("defaultVersion")
        if spec.name not in defaults or marked is True:
            defaults[spec.name] = spec.version
    return defaults


def template_entry(configured: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The config's first entry without what belongs to its own archive."""
    for versions in configured.values():
        for entry in versions.values():
            return {key: value for key, value in entry.items() if key not in ENTRY_ONLY_KEYS}
    return {}


def models_entry_for(
    specs: Sequence[ModelSpec], configured: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """The ``models=`` value that serves ``specs`` (see the module's docstring)."""
    defaults = default_versions(specs, configured)
    template = template_entry(configured)
    models: dict[str, dict[str, dict[str, Any]]] = {}
    for spec in specs:
        own = configured.get(spec.name, {}).get(spec.version)
        settings = {k: v for k, v in (own or template).items() if k not in ENTRY_ONLY_KEYS}
        models.setdefault(spec.name, {})[spec.version] = {
            "defaultVersion": defaults[spec.name] == spec.version,
            "marName": archive_name(spec, specs),
            **settings,
        }
    return models


def serving_overrides(
    specs: Sequence[ModelSpec], configured: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, str]:
    """``load_models`` and ``models`` for config.properties, to serve ``specs``."""
    models = models_entry_for(specs, configured)
    ordered = sorted(specs, key=lambda spec: not models[spec.name][spec.version]["defaultVersion"])
    return {
        "load_models": ",".join(archive_name(spec, specs) for spec in ordered),
        "models": json.dumps(models),
    }


def served_models(properties: dict[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
    """{name: {version: entry}} of a config (an instance's effective one)."""
    return dict(json.loads(properties.get("models", "{}")))


def without(properties: dict[str, str], refused: dict[str, str]) -> dict[str, str]:
    """``properties`` without the model versions ``refused`` (``NAME:VERSION`` -> reason) in
    ``models=`` and ``load_models``; a name left without its default gets the first version
    left as its default (first in ``load_models``)."""
    if not refused:
        return dict(properties)
    models = served_models(properties)
    files: list[str] = []
    kept: dict[str, dict[str, dict[str, Any]]] = {}
    for name, versions in models.items():
        left = {v: e for v, e in versions.items() if f"{name}:{v}" not in refused}
        if left and not any(entry.get("defaultVersion") for entry in left.values()):
            first = next(iter(left))
            left[first] = left[first] | {"defaultVersion": True}
        if left:
            kept[name] = left
    for name, versions in kept.items():
        for entry in sorted(versions.values(), key=lambda e: not e.get("defaultVersion")):
            files.append(str(entry.get("marName", f"{name}.mar")))
    return properties | {"models": json.dumps(kept), "load_models": ",".join(files)}


def package_models(
    specs: Sequence[ModelSpec],
    store: Path,
    configured: dict[str, dict[str, dict[str, Any]]],
    model_config: Path | None = None,
    precision: str | None = None,
) -> tuple[dict[str, str] | None, dict[str, str]]:
    """Package into ``store`` each model whose source changed; the overrides that serve those
    that could be packaged with the settings ``configured`` (a config's ``models=``; None if
    none could), and why each other one is refused (``NAME:VERSION`` -> the package check's
    reasons)."""
    from bert_serve_server.archive import (
        package_if_changed,  # here: the image's sizing imports this module
    )

    refused: dict[str, str] = {}
    for spec in specs:
        archive = store / archive_name(spec, specs)
        config = handler_config_for(spec.name, model_config or DEFAULT_MODEL_CONFIG)
        if not (spec.model_dir / "config.json").is_file():
            refused[spec.key] = f"{spec.model_dir} has no config.json: not a Hugging Face folder"
            continue
        try:
            built = package_if_changed(
                spec.model_dir, archive, config, spec.name, spec.version, precision
            )
        except SystemExit as error:
            refused[spec.key] = str(error)
            continue
        print(f"{spec.key}: {archive.name} {'packaged' if built else 'unchanged'}")
    kept = [spec for spec in specs if spec.key not in refused]
    if not kept:
        return None, refused
    return serving_overrides(kept, configured) | {"model_store": str(store)}, refused
