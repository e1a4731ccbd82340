"""config/config.properties: read it, override some keys, and write an instance's copy."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BASE_CONFIG = ROOT / "config" / "config.properties"
MODEL_NAME = "bert"
MODEL_VERSION = "1.0"
ADDRESS_KEYS = ("inference_address", "management_address", "metrics_address")
PATH_KEYS = ("model_store", "metrics_config")
GRPC_PORT_KEYS = ("grpc_inference_port", "grpc_management_port")
LOG_CONFIG_FLAG = "-Dlog4j.configurationFile="


def read_properties(path: Path) -> dict[str, str]:
    properties: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            properties[key.strip()] = value.strip()
    return properties


def properties_text(properties: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in properties.items())


def effective_properties(
    overrides: dict[str, str] | None = None, base_config: Path = BASE_CONFIG
) -> dict[str, str]:
    """The base config with overrides applied and its paths made absolute."""
    properties = read_properties(base_config) | (overrides or {})
    for key in PATH_KEYS:
        if key in properties:
            path = Path(properties[key])
            properties[key] = str(path if path.is_absolute() else ROOT / path)
    if "vmargs" in properties:
        properties["vmargs"] = with_log_config(properties["vmargs"], lambda path: ROOT / path)
    return properties


def log_config_path(vmargs: str) -> Path | None:
    """The log4j2 file named in ``vmargs`` (``-Dlog4j.configurationFile=...``), if any."""
    for word in vmargs.split():
        if word.startswith(LOG_CONFIG_FLAG):
            return Path(word.removeprefix(LOG_CONFIG_FLAG))
    return None


def with_log_config(vmargs: str, place: Callable[[Path], Path]) -> str:
    """``vmargs`` with a relative log4j2 path replaced by ``place(path)`` (TorchServe would
    resolve it against its working directory, the instance's state folder)."""
    words = []
    for word in vmargs.split():
        if word.startswith(LOG_CONFIG_FLAG):
            path = Path(word.removeprefix(LOG_CONFIG_FLAG))
            word = LOG_CONFIG_FLAG + str(path if path.is_absolute() else place(path))
        words.append(word)
    return " ".join(words)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_port_overrides() -> dict[str, str]:
    """Free 127.0.0.1 ports for every listener, for a test or benchmark instance."""
    overrides = {key: f"http://127.0.0.1:{free_port()}" for key in ADDRESS_KEYS}
    return overrides | {key: str(free_port()) for key in GRPC_PORT_KEYS}


def read_models(config: Path = BASE_CONFIG) -> dict[str, dict[str, dict[str, Any]]]:
    """The ``models=`` entry of a config.properties, parsed: {model: {version: settings}}."""
    return dict(json.loads(read_properties(config)["models"]))


def configured_model(config: Path = BASE_CONFIG) -> dict[str, Any]:
    """The settings ``models=`` gives our model and version (batchSize, maxBatchDelay,
    minWorkers, maxWorkers, ...)."""
    return read_models(config)[MODEL_NAME][MODEL_VERSION]


SILENT_DEFAULTS = {"batchSize": 1, "maxBatchDelay": 100}
"""What TorchServe 0.12 uses instead of a ``models=`` value <= 0, without a word: its
``ConfigManager.getJsonIntValue`` returns the default for any value <= 0. So
``"maxBatchDelay": 0`` waits 100 ms for batch-mates (measured: a lone request 4 -> 104 ms)."""


def models_entry_problems(models_text: str) -> list[str]:
    """Each ``models=`` value TorchServe would silently replace, with the fix. A batch delay
    is only waited for batch-mates, so with batchSize 1 it is never used and any value goes."""
    problems = []
    for model, versions in json.loads(models_text).items():
        for version, entry in versions.items():
            for key, default in SILENT_DEFAULTS.items():
                value = entry.get(key)
                if key == "maxBatchDelay" and entry.get("batchSize") == 1:
                    continue
                if isinstance(value, int) and value <= 0:
                    problems.append(
                        f"models: {model} {version} {key}={value} would run as {default} "
                        f"(TorchServe 0.12 replaces values <= 0 by its default): use 1 or more"
                    )
    return problems


def models_entry(
    batch_size: int | None = None, max_batch_delay: int | None = None, workers: int | None = None
) -> str:
    """config.properties' ``models=`` entry with some values replaced."""
    models = read_models()
    entry = models[MODEL_NAME][MODEL_VERSION]
    if batch_size is not None:
        entry["batchSize"] = batch_size
    if max_batch_delay is not None:
        entry["maxBatchDelay"] = max_batch_delay
    if workers is not None:
        entry["minWorkers"] = entry["maxWorkers"] = workers
    return json.dumps(models)
