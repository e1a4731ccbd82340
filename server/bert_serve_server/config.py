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


def read_models(config: Path = BASE_CONFIG) -> dict[str, dict[str, dict[str, Any]]]:
    """The ``models=`` entry of a config.properties, parsed: {model: {version: settings}}."""
    return dict(json.loads(read_properties(config).get("models", "{}")))


SIZED_AT_START = "sizedAtStart"
"""A ``models=`` entry's record of the values it holds for a plain ``torchserve --start``
(``{"batchSize": 64}``): the project's start (``bert_serve_server.sizing``) sizes each value that
is still the one recorded from the machine instead; a value changed since (by hand, or by a
tool's override) is stated, as is every value the record does not name. TorchServe ignores
the key."""
SIZABLE_KEYS = ("minWorkers", "maxWorkers", "batchSize")
"""What ``SIZED_AT_START`` may name: the values the project's start derives for a model."""


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
