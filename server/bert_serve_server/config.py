"""config/config.properties: read it, override some keys, and write an instance's copy; and its
``models=`` entry, the one reader of it, the entry that serves several models, and whether the
models it serves are ready (``unready``: the one definition, for the start and the probes).

``make serve MODELS="sentiment=DIR toxicity:2=DIR2"`` names each model ``NAME[:VERSION]=DIR``
(version ``1.0`` when left out). One name may be listed with several versions: all of them are
loaded, each at ``/predictions/NAME/VERSION``, and ``/predictions/NAME`` answers the default
one. The default of a name is the version that config.properties' ``models=`` marks
``"defaultVersion": true``, else the first listed.

From that list ``serving_overrides`` derives what TorchServe reads at start: ``load_models``
(the default versions first: TorchServe 0.12 makes the first version it registers the default,
and reads ``defaultVersion`` only when it restores a snapshot) and a ``models=`` entry per name
and version. Each entry is the config's own entry for that name and version where it has one,
else the settings of the config's first entry (batch delay, workers, batch size: what the
config states for its model applies to every model it does not name). A model's archive is
``model_store/NAME.mar``, or ``NAME-vVERSION.mar`` when several versions of NAME are served
(``archive_name``; packing them: ``bert_serve_server.archive.package_models``).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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
TS_CONFIG_ENV = "TS_CONFIG_FILE"
"""TorchServe reads the file this names in place of any ``--ts-config``: a start and the sizing
step refuse it, so that the config they size is the one that runs."""


def read_properties(path: Path) -> dict[str, str]:
    """A config.properties as TorchServe's ``java.util.Properties`` reads it
    (``parse_properties``)."""
    return parse_properties(path.read_text(encoding="latin-1"))


def logical_lines(text: str) -> list[str]:
    """Java's logical lines: comments (``#``, ``!``) and blank lines dropped, a line ending in
    an odd number of backslashes continued on the next, whose leading blanks are skipped."""
    lines: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if pending is None and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        continued = trailing % 2 == 1
        if continued:
            line = line[:-1]
        pending = line if pending is None else pending + line
        if not continued:
            lines.append(pending)
            pending = None
    if pending is not None:
        lines.append(pending)
    return lines


ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def unescape(text: str) -> str:
    """Java's escapes: ``\\t \\n \\r \\f``, ``\\uXXXX``, and a backslash before any other
    character standing for that character."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            out.append(char if char != "\\" else "")
            i += 1
            continue
        following = text[i + 1]
        if following == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) < 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError(f"malformed \\uxxxx escape in {text!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(ESCAPES.get(following, following))
        i += 2
    # a character past U+FFFF comes as two escapes (a surrogate pair): joined as Java does
    return "".join(out).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def split_key(line: str) -> tuple[str, str]:
    """(key, value) of a logical line: the key ends at the first unescaped ``=``, ``:`` or
    blank; blanks and one ``=`` or ``:`` after it are skipped."""
    i = 0
    while i < len(line) and line[i] not in "=: \t\f":
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return unescape(key), unescape(rest)


def parse_properties(text: str) -> dict[str, str]:
    """``text`` as ``java.util.Properties.load`` reads it: continuation lines, ``=``, ``:`` or
    a blank between key and value, escapes; the last value of a key wins. Trailing blanks are
    part of a value in Java, and kept."""
    return dict(split_key(line) for line in logical_lines(text))


def escape(text: str, key: bool = False) -> str:
    """``text`` written so that ``parse_properties`` (and Java) read it back unchanged."""
    out = text.replace("\\", "\\\\")
    for char, name in (("\n", "n"), ("\r", "r"), ("\t", "t"), ("\f", "f")):
        out = out.replace(char, "\\" + name)
    if key:
        for char in "=: #!":
            out = out.replace(char, "\\" + char)
    elif out[:1] in (" ", "#", "!"):
        out = "\\" + out
    return "".join(
        char if " " <= char <= "~" else "".join(f"\\u{unit:04x}" for unit in utf16_units(char))
        for char in out
    )


def utf16_units(char: str) -> list[int]:
    """The UTF-16 code units of one character (a surrogate pair past U+FFFF), as Java's
    ``\\uXXXX`` escapes spell it."""
    data = char.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


def properties_text(properties: dict[str, str]) -> str:
    return "".join(
        f"{escape(key, key=True)}={escape(value)}\n" for key, value in properties.items()
    )


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


def served_models(properties: dict[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
    """The ``models=`` entry of a config, parsed: {name: {version: entry}} (none: {})."""
    return dict(json.loads(properties.get("models", "{}")))


def read_models(config: Path = BASE_CONFIG) -> dict[str, dict[str, dict[str, Any]]]:
    """The ``models=`` entry of a config.properties file (``served_models``)."""
    return served_models(read_properties(config))


SIZED_AT_START = "sizedAtStart"
"""A ``models=`` entry's record of the values it holds for a plain ``torchserve --start``
(``{"batchSize": 64}``): the project's start (``bert_serve_server.sizing``) sizes each value that
is still the one recorded from the machine instead; a value changed since (by hand, or by a
tool's override) is stated, as is every value the record does not name. TorchServe ignores
the key."""
SIZABLE_KEYS = ("minWorkers", "maxWorkers", "batchSize")
"""What ``SIZED_AT_START`` may name: the values the project's start derives for a model."""
PRECISION_KEY = "precision"
"""A ``models=`` entry's precision for an archive configured ``precision: auto``: the project's
start writes its choice there (``sizing.with_precisions``), which a plan then states, and hands
it to the workers (``handler.precision.CHOSEN_ENV``). TorchServe ignores the key."""
PRECISION_ENV = "BERT_SERVE_PRECISION_CHOSEN"
"""Where the workers find the start's choices, ``NAME:VERSION=PRECISION`` by commas: the name
``handler.precision.CHOSEN_ENV`` reads (the server package does not import the handler)."""
PLANNED_KEYS = (*SIZABLE_KEYS, PRECISION_KEY)
"""A model's values a saved plan states."""


def plain_start_values(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry's values that are still those its ``SIZED_AT_START`` records."""
    recorded = entry.get(SIZED_AT_START)
    if not isinstance(recorded, dict):
        return {}
    return {key: value for key, value in recorded.items() if key in entry and entry[key] == value}


def stated_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A ``models=`` entry as the project's start takes it as stated: without the values that
    are still the plain start's (``plain_start_values``), and without ``SIZED_AT_START``."""
    plain = plain_start_values(entry)
    return {key: value for key, value in entry.items() if key not in {*plain, SIZED_AT_START}}


def with_stated_values(entry: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with ``values`` put in as stated, even one equal to the plain start's: each is
    taken out of ``SIZED_AT_START`` (dropped once it records nothing)."""
    entry = entry | values
    recorded = entry.pop(SIZED_AT_START, None)
    if isinstance(recorded, dict):
        recorded = {key: value for key, value in recorded.items() if key not in values}
    return entry | ({SIZED_AT_START: recorded} if recorded else {})


def configured_model(config: Path = BASE_CONFIG) -> dict[str, Any]:
    """The settings ``models=`` states for our model and version, as the project's start takes
    them (``stated_entry``: maxBatchDelay, ...; not the plain start's batchSize, which it
    sizes)."""
    return stated_entry(read_models(config)[MODEL_NAME][MODEL_VERSION])


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
    """config.properties' ``models=`` entry with some values replaced, each stated
    (``with_stated_values``); the others as the file has them."""
    models = read_models()
    values: dict[str, int] = {}
    if batch_size is not None:
        values["batchSize"] = batch_size
    if max_batch_delay is not None:
        values["maxBatchDelay"] = max_batch_delay
    if workers is not None:
        values["minWorkers"] = values["maxWorkers"] = workers
    versions = models[MODEL_NAME]
    versions[MODEL_VERSION] = with_stated_values(versions[MODEL_VERSION], values)
    return json.dumps(models)


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
"""What TorchServe accepts as a model name (and what we accept as a version)."""
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


def unready(
    models: Mapping[str, Iterable[str]],
    described: Mapping[str, list[dict[str, Any]] | None],
    every_worker: bool,
) -> list[str]:
    """Why the served models are not ready; empty when they are. ``models``: name -> the
    versions the config serves; ``described``: name -> the management API's ``/models/NAME/all``
    (None where it did not answer). ``every_worker``: all workers READY (started), else at
    least one per version (serving)."""
    problems = []
    for name, versions in models.items():
        entries = described.get(name)
        if entries is None:
            problems.append(f"model {name}: not described by the management API")
            continue
        found = {str(entry.get("modelVersion")): entry.get("workers") or [] for entry in entries}
        for version in versions:
            states = [worker.get("status") for worker in found.get(str(version), [])]
            ready = [state == "READY" for state in states]
            if not states:
                problems.append(f"model {name} {version}: no workers")
            elif not (all(ready) if every_worker else any(ready)):
                problems.append(f"model {name} {version}: workers {states}")
    if not models:
        problems.append("the config serves no model")
    return problems
