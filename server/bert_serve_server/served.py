"""The models a config serves (``models=``), each with its archive, and their workers: the
workers the config states, and for the others ``rules.shared_workers`` on one worker's memory as
measured (``measure.measured_memory``), capped by a stated ``maxWorkers``. A value that is still
the one an entry's ``sizedAtStart`` records is the plain ``torchserve --start``'s, not stated
(``sized_at_start``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bert_serve_server.config import (
    SIZABLE_KEYS,
    SIZED_AT_START,
    plain_start_values,
    stated_entry,
)
from bert_serve_server.machine import Machine
from bert_serve_server.measure import (
    MeasureError,
    WorkerMemory,
    archive_handler_config,
    holds_a_model,
    measured_memory,
)
from bert_serve_server.rules import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_TEXTS,
    GPU_WORKER_HOST_BYTES,
    MIB,
    UNMEASURED_WORKER_OVERHEAD_BYTES,
    DeviceLoad,
    shared_workers,
    threads_for,
)


class SizingError(ValueError):
    """A config that cannot be sized; the message says why and what to change."""


@dataclass(frozen=True)
class Served:
    """One model version of a ``models=`` entry and its archive."""

    name: str
    version: str
    entry: dict[str, Any]
    mar: Path

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}"


def served_list(properties: dict[str, str]) -> list[Served]:
    if "models" not in properties:
        raise SizingError(
            "the config has no models= entry: state the models to serve and their settings, "
            'e.g. models={"bert": {"1.0": {"marName": "bert.mar"}}} (docs/configuration.md)'
        )
    if "model_store" not in properties:
        raise SizingError("the config has no model_store=: state the folder of the .mar files")
    try:
        models = json.loads(properties["models"])
    except json.JSONDecodeError as error:
        raise SizingError(f"the config's models= is not JSON: {error}") from None
    store = Path(properties["model_store"])
    return [
        Served(name, version, entry, store / entry.get("marName", f"{name}.mar"))
        for name, versions in models.items()
        for version, entry in versions.items()
    ]


def sized_at_start(properties: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """``properties`` with each ``models=`` value that is still the plain ``torchserve
    --start``'s its ``sizedAtStart`` records (``config.SIZED_AT_START``) taken out, so that the
    sizing derives it, and that record dropped; and a line per entry saying which values were
    taken out and which, changed since, are stated. A record of a value the start does not
    size is refused: a misspelt name would otherwise leave its value stated without a word."""
    if SIZED_AT_START not in properties.get("models", ""):
        return properties, []
    try:
        models = json.loads(properties["models"])
    except json.JSONDecodeError:
        return properties, []  # served_list says why
    notes = []
    for name, versions in models.items():
        for version, entry in versions.items():
            recorded = entry.get(SIZED_AT_START)
            if recorded is None:
                continue
            if not isinstance(recorded, dict) or not set(recorded) <= set(SIZABLE_KEYS):
                raise SizingError(
                    f"models: {name} {version} {SIZED_AT_START}={json.dumps(recorded)}: the "
                    f"plain start's values of {', '.join(SIZABLE_KEYS)} are expected, as in "
                    '{"batchSize": 64}'
                )
            plain = plain_start_values(entry)
            versions[version] = stated_entry(entry)
            if plain:
                shown = ", ".join(f"{key} {value}" for key, value in plain.items())
                notes.append(
                    f"{name}:{version}: config.properties' {shown} ({SIZED_AT_START}) is what a "
                    "plain torchserve --start serves: sized here"
                )
            changed = [key for key in recorded if key in entry and key not in plain]
            if changed:
                shown = ", ".join(f"{key} {entry[key]}" for key in changed)
                notes.append(f"{name}:{version}: {shown}: changed from {SIZED_AT_START}'s, stated")
    return properties | {"models": json.dumps(models)}, notes


def archive_limits(mar: Path) -> tuple[int, int]:
    """The handler's ``max_chars`` and ``max_texts_per_request`` in the archive's
    model-config.yaml, else its defaults."""
    handler = archive_handler_config(mar)
    return (
        int(handler.get("max_chars", DEFAULT_MAX_CHARS)),
        int(handler.get("max_texts_per_request", DEFAULT_MAX_TEXTS)),
    )


def runs_on_gpu(machine: Machine, mar: Path) -> bool:
    """The model's workers will use a GPU: there is one, and its config does not say ``cpu``."""
    return bool(machine.gpus) and archive_handler_config(mar).get("device", "auto") != "cpu"


MEASURED_WORKER_HEADROOM = 1.15
"""A serving worker holds more than the measuring process at its peak: in the image under the
pod's limits, the worker after a burst held 481.6 MiB RSS (477.5 PSS) where the start had
measured 472 (2 % more), and the same measurement spread 550-648 MiB (±8 %) on one loaded
2-core machine. 15 % covers both; tests/unit/test_sizing_memory.py holds the budget to the
image record's worker."""


def budgeted_bytes(memory: WorkerMemory) -> int:
    """What the sizing budgets for one worker of ``memory`` as measured."""
    return round(memory.peak_bytes * MEASURED_WORKER_HEADROOM)


def worker_host_bytes(model: Served, on_gpu: frozenset[str]) -> tuple[int, str]:
    """One worker's host memory and where it comes from: a GPU worker's as measured on a GPU;
    else the peak resident set of one worker as measured here; an archive with no model to
    measure, the archive and ``UNMEASURED_WORKER_OVERHEAD_BYTES``."""
    if model.key in on_gpu:
        return GPU_WORKER_HOST_BYTES, "a GPU worker's host memory"
    if not holds_a_model(model.mar):
        return model.mar.stat().st_size + UNMEASURED_WORKER_OVERHEAD_BYTES, "not measured"
    try:
        memory = measured_memory(str(model.mar), model.mar.stat().st_mtime_ns)
    except Exception as error:  # the model's own code failed
        raise MeasureError(model.key, f"{type(error).__name__}: {error}") from error
    return (
        budgeted_bytes(memory),
        f"measured: peak RSS after loading and the largest batch, +{MEASURED_WORKER_HEADROOM - 1:.0%}",
    )


def with_workers(
    machine: Machine,
    models: list[Served],
    loads: dict[str, DeviceLoad] | None = None,
    on_gpu: frozenset[str] = frozenset(),
    stated_threads: int | None = None,
) -> tuple[list[Served], int, list[str]]:
    """Each model with its workers (the config's, else ``shared_workers``: on the GPUs for the
    models of ``loads``, then the cores left for the others; a stated ``maxWorkers`` caps
    them), and the torch threads per worker. Memory is measured only where workers are sized."""
    loads = loads or {}
    stated = [model for model in models if "minWorkers" in model.entry]
    unstated = [model for model in models if "minWorkers" not in model.entry]
    sizes: dict[str, int] = {}
    reasons = ["workers: stated"] if stated else []
    if unstated:
        for model in models:
            sizes[model.key], source = worker_host_bytes(model, on_gpu)
            reasons.append(f"{model.key}: a worker holds {sizes[model.key] // MIB} MiB ({source})")
    taken = sum(int(model.entry["minWorkers"]) for model in stated)
    taken_bytes = sum(int(m.entry["minWorkers"]) * sizes.get(m.key, 0) for m in stated)
    chosen: dict[str, int] = {}
    on_gpus = [m for m in unstated if m.key in loads]
    on_cpu = [m for m in unstated if m.key not in loads]
    for group, group_loads in ((on_gpus, [loads[m.key] for m in on_gpus]), (on_cpu, None)):
        if not group:
            continue
        group_machine = machine if group_loads else replace(machine, gpus=0)
        counts, why = shared_workers(
            group_machine, [sizes[m.key] for m in group], taken, taken_bytes, group_loads
        )
        if on_gpus and on_cpu:
            where = "on the GPUs" if group_loads else "on the CPU (device: cpu)"
            why = [f"{', '.join(m.key for m in group)} {where}: {reason}" for reason in why]
        for i, model in enumerate(group):
            cap = model.entry.get("maxWorkers")
            if cap is not None and counts[i] > int(cap):
                why.append(f"{model.key}: {int(cap)} worker(s), the stated maxWorkers")
                counts[i] = int(cap)
        reasons += why
        chosen |= {m.key: n for m, n in zip(group, counts, strict=True)}
        taken += sum(counts)
        taken_bytes += sum(n * sizes[m.key] for m, n in zip(group, counts, strict=True))
    models = [
        model
        if model.key not in chosen
        else replace(
            model,
            entry={"minWorkers": chosen[model.key], "maxWorkers": chosen[model.key]}
            | model.entry
            | {"minWorkers": chosen[model.key]},
        )
        for model in models
    ]
    total = sum(int(model.entry["minWorkers"]) for model in models)
    if stated_threads is not None:
        return (
            models,
            stated_threads,
            [*reasons, f"{stated_threads} torch thread(s) per worker: stated"],
        )
    threads = 1 if on_gpu else threads_for(replace(machine, gpus=0), total)
    cause = "the forward runs on the GPU" if on_gpu else "the CPUs paid for shared among them"
    reasons.append(f"{threads} torch thread(s) per worker: {cause}")
    return models, threads, reasons
