"""Serving settings for every value config/config.properties leaves out (or marks
``sizedAtStart``: ``sized_at_start``): each model's workers and ``batchSize``,
``job_queue_size``, the JVM heap and the torch threads per worker; the plan a start runs, from
what the machine is and one worker measures (``bert_serve_server.probe``) by the pure rules of
``bert_serve_server.rules``, with what the deployment states. ``resolve`` makes the plan
(``Resolved``, with its reasons); ``main`` is the image's sizing step (``SIZE_USAGE``).

The rule, in the order it is applied:

- **Workers**: on a CPU, one per physical core (``rules.cpu_workers``), so batches run side by
  side; the torch threads of each are the CPUs paid for shared among them
  (``rules.threads_for``). Capped so that the workers' memory, as measured (the peak resident
  set of one worker after loading, its largest forward pass and holding and tokenizing the
  largest batch the limits admit, at the threads the plan gives it: ``probe.Probe``,
  ``workers_at_their_threads``), fits in half of the memory; the heap gets the rest. On GPUs: as many per GPU as keep it busy, measured (``rules.gpu_workers``).
  A model that states ``maxWorkers`` alone gets no more than that.
- **Several models** (each version of a name counts as one): the cores left after the workers
  the config states are shared out equally; the memory cap takes one worker at a time from the
  model with the most.
- **Batch size**: the smallest whose measured rate (the best of ``probe.ROUNDS`` rounds) is
  within ``rules.NEAR_BEST`` of the best of ``rules.BATCH_SIZES``.
- **Queue** (requests): what the workers drain in ``rules.PATIENT_S`` at that rate, one text a
  request; on a GPU never more than the GPU drains (a batch per the GPU's measured busy time:
  its kernels, timed by the profiler, else the pass's wall time).
  TorchServe has one size for every model's queue: with several models, the largest.
- **Heap**: ``rules.BASE_HEAP_MIB`` plus each model's queue of requests of the largest body the
  frontend admits and the handler accepts (``max_request_size``, lists included; set to the
  handler's largest body where the config states none), each as the JVM's collector holds it
  (``rules.heap_request_bytes``; the collector is stated with the heap), within what the memory
  leaves beside the workers, the JVM's non-heap memory and ``rules.SERVER_SLACK_BYTES``; where
  that binds, the queue is cut to what the heap holds; where it holds fewer requests than the workers take at once (workers stated, or
  several models' workers, beyond what the memory leaves), the start is refused with the reason.
- **Stated settings win, the others follow them**: a stated queue gets a heap that holds it; a
  stated heap gets a queue cut to what it holds (a heap that holds fewer requests than there are
  workers is refused with the heap that would); a stated ``-Xms`` is a floor for a derived heap.

A model whose archive cannot be read or whose model cannot be loaded for measuring is left out
(``Resolved.refused``, with the reason): the others are served.

**What a deployment states** at start through environment variables, without rebuilding the
image or its config (a Kubernetes Deployment's ``env``, or a ConfigMap through ``envFrom``):

=========================  ====================================================================
``BERT_SERVE_CORES``       the cores (and CPUs) to size for, in place of what the cgroup says
``BERT_SERVE_MEMORY``      the memory to size for: bytes, or a quantity (``4Gi``, ``1536Mi``, ``2G``);
                           never more than the cgroup limit and the physical memory
``BERT_SERVE_WORKERS``     workers of every model (``minWorkers`` = ``maxWorkers``)
``BERT_SERVE_THREADS``     torch threads per worker (``OMP_NUM_THREADS``, if set, still wins)
``BERT_SERVE_BATCH_SIZE``  ``batchSize`` of every model
``BERT_SERVE_QUEUE``       ``job_queue_size``
``BERT_SERVE_HEAP``        the JVM heap (``-Xmx``): MiB, or a quantity (``2g``, ``512m``, ``2Gi``)
``BERT_SERVE_PLAN``        a plan file written by ``size --plan-out``: every value it chose, used as
                           stated, nothing measured (``read_plan``)
=========================  ====================================================================

A variable wins over the plan, which wins over the config file; what none states is derived
from the machine. Each stated value is printed with the variable that stated it.

**A saved plan**: what one start chose and why, in a file a later start (or every replica of a
Deployment, from a ConfigMap) takes as stated, so a fleet runs one plan measured once per kind
of node and a restart cannot change it.

``python -m bert_serve_server size --plan-out plan.json -- --ts-config config.properties`` writes
one; ``BERT_SERVE_PLAN=plan.json`` (or ``size --plan plan.json``) uses it: each model's workers
and ``batchSize``, ``job_queue_size``, ``max_request_size``, the heap and the torch threads are
put into the config as stated, and nothing is measured. A model of the config that the plan
does not hold is sized as usual, and said so; an archive that differs from the one the plan
was measured on (its size) is said so too. Environment variables still win over the plan.

**The image's sizing step** (``python -m bert_serve_server size``):

    size --out FILE [--plan-out PLAN] [--plan PLAN] -- TORCHSERVE_ARGS

Reads the config TorchServe's own arguments name (the last ``--ts-config``; ``--model-store``
in place of the config's ``model_store``, as TorchServe takes it), sizes it (``resolve``, with
what ``BERT_SERVE_*`` variables state), writes it to ``--out`` and prints the torch threads per worker, then the workers' precisions
(``PRECISION_ENV``'s value, empty where none is chosen); the reasons go to stderr. ``--plan-out``
also writes the plan (``plan_of``); ``--plan`` (or ``BERT_SERVE_PLAN``) uses one.

``TS_CONFIG_FILE`` is refused: TorchServe reads it in place of any ``--ts-config``, so the
sized config would not be the one that runs. A config that cannot be sized, or a stated value
that cannot run, ends with one line saying why (exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from bert_serve_server import rules
from bert_serve_server.config import (
    PLANNED_KEYS,
    PRECISION_KEY,
    SIZABLE_KEYS,
    SIZED_AT_START,
    TS_CONFIG_ENV,
    plain_start_values,
    properties_text,
    read_properties,
    served_models,
    stated_entry,
    without,
)
from bert_serve_server.probe import (
    NOT_MEASURED,
    MeasureError,
    Probe,
    WorkerMemory,
    archive_handler_config,
    holds_a_model,
    measured_device_load,
    measured_memory,
    measured_precision,
    measured_rates,
    probing,
    read_machine,
    serving_gpus,
)
from bert_serve_server.rules import (
    BATCH_SIZES,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_TEXTS,
    GPU_WORKER_HOST_BYTES,
    MIB,
    MIN_HEAP_FLAG,
    PHYSICAL,
    STATED,
    UNMEASURED_WORKER_OVERHEAD_BYTES,
    DeviceLoad,
    Machine,
    QueueInputs,
    SizingError,
    StatedError,
    batch_size_for,
    derive,
    gc_flag_in,
    heap_mib_in,
    heap_stated,
    least_memory,
    queued_request_bytes,
    shared_workers,
    threads_for,
)

SIZE_USAGE = (
    "``python -m bert_serve_server size``: the image's sizing step, and a plan for a fleet."
)
INFERENCE_ADDRESS_ENV = "BERT_SERVE_INFERENCE_ADDRESS"
"""Where the image's TorchServe serves inference instead of the baked config's 0.0.0.0: the
Kubernetes Deployment sets ``http://127.0.0.1:8080``, so only its proxy sidecar reaches it;
KServe's runtime, which has no sidecar, leaves it unset."""


QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?|[kKmMgGtT])?[bB]?\s*$")
BINARY = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


class StatedValueError(SizingError):
    """A ``BERT_SERVE_*`` value that cannot be read; the message names the variable."""


@dataclass(frozen=True)
class Stated:
    cores: float | None = None
    memory_bytes: int | None = None
    workers: int | None = None
    threads: int | None = None
    batch_size: int | None = None
    queue: int | None = None
    heap_mib: int | None = None
    plan: Path | None = None
    precision: str | None = None

    def lines(self) -> list[str]:
        """What is stated, one line each, with its variable."""
        return [
            f"stated: {field.name} {value} ({VARIABLES[field.name]})"
            for field in fields(self)
            if (value := getattr(self, field.name)) is not None
        ]


VARIABLES = {
    "cores": "BERT_SERVE_CORES",
    "memory_bytes": "BERT_SERVE_MEMORY",
    "workers": "BERT_SERVE_WORKERS",
    "threads": "BERT_SERVE_THREADS",
    "batch_size": "BERT_SERVE_BATCH_SIZE",
    "queue": "BERT_SERVE_QUEUE",
    "heap_mib": "BERT_SERVE_HEAP",
    "plan": "BERT_SERVE_PLAN",
    "precision": "BERT_SERVE_PRECISION",
}
STATED_PRECISIONS = ("fp32", "bf16", "fp16", "tf32")


def quantity_bytes(text: str, default_unit: str = "", jvm: bool = False) -> int:
    """``text`` in bytes: a number with an optional unit, binary (``Ki``, ``Mi``, ``Gi``, and
    the JVM's ``k``, ``m``, ``g``) or decimal (Kubernetes' ``K``, ``M``, ``G``; with ``jvm``
    these are binary too, as ``-Xmx`` reads them)."""
    match = QUANTITY.match(text)
    if not match:
        raise StatedValueError(f"{text!r} is not a quantity like 4Gi, 1536Mi, 2g or 512")
    number, unit = float(match.group(1)), match.group(2) or default_unit
    letter = unit[:1].lower()
    binary = jvm or unit.endswith("i") or unit[:1].islower() or unit == default_unit
    return int(number * (BINARY if binary else DECIMAL)[letter])


def positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise StatedValueError(f"{name}={text!r}: a whole number is needed") from None
    if value < 1:
        raise StatedValueError(f"{name}={text!r}: at least 1 is needed")
    return value


def read_stated(environ: Mapping[str, str]) -> Stated:
    """The settings ``environ`` states (empty variables state nothing); a value that cannot be
    read is refused with the variable's name (``StatedValueError``)."""
    given = {
        name: environ[var].strip()
        for name, var in VARIABLES.items()
        if environ.get(var, "").strip()
    }
    values: dict[str, object] = {}
    for name, text in given.items():
        var = VARIABLES[name]
        try:
            if name == "cores":
                cores = float(text)
                if cores <= 0:
                    raise StatedValueError(f"{var}={text!r}: more than 0 is needed")
                values[name] = cores
            elif name == "memory_bytes":
                values[name] = quantity_bytes(text)
            elif name == "heap_mib":
                values[name] = quantity_bytes(text, default_unit="m", jvm=True) // 2**20
            elif name == "plan":
                values[name] = Path(text)
            elif name == "precision":
                if text not in STATED_PRECISIONS:
                    raise StatedValueError(f"{var}={text!r}: one of {STATED_PRECISIONS} is needed")
                values[name] = text
            else:
                values[name] = positive_int(var, text)
        except StatedValueError as error:
            message = str(error)
            raise StatedValueError(
                message if message.startswith(var) else f"{var}: {message}"
            ) from None
    return Stated(**values)  # type: ignore[arg-type]


def with_stated(
    machine: Machine, properties: dict[str, str], stated: Stated
) -> tuple[Machine, dict[str, str]]:
    """The machine and config with what the environment states put in."""
    if stated.cores is not None:
        machine = replace(machine, cores=stated.cores, cpus=stated.cores)
    if stated.memory_bytes is not None:
        bounds = machine.memory_bounds or ((PHYSICAL, machine.memory_bytes),)
        bounds = (*bounds, (STATED, stated.memory_bytes))
        machine = replace(machine, memory_bytes=least_memory(bounds)[1], memory_bounds=bounds)
    properties = dict(properties)
    if stated.queue is not None:
        properties["job_queue_size"] = str(stated.queue)
    if stated.heap_mib is not None:
        properties["vmargs"] = f"{properties.get('vmargs', '')} -Xmx{stated.heap_mib}m".strip()
    per_model: dict[str, int] = {}
    if stated.workers is not None:
        per_model |= {"minWorkers": stated.workers, "maxWorkers": stated.workers}
    if stated.batch_size is not None:
        per_model["batchSize"] = stated.batch_size
    if per_model and "models" in properties:
        models = served_models(properties)
        for versions in models.values():
            for entry in versions.values():
                entry.update(per_model)
        properties["models"] = json.dumps(models)
    return machine, properties


PLAN_VERSION = 1


class PlanError(SizingError):
    """A plan file that cannot be read or is not a plan."""


@dataclass(frozen=True)
class Plan:
    models: dict[str, dict[str, dict[str, int]]]
    job_queue_size: int | None
    max_request_size: int | None
    heap_mib: int | None
    torch_threads: int
    archives: dict[str, int]
    """``NAME:VERSION`` -> the size in bytes of the archive it was measured on."""
    why: list[str]
    gc_flag: str | None = None
    """The collector the heap was sized for (``rules.gc_flag_in``), stated with it."""


def plan_of(
    report: dict[str, Any],
    heap_mib: int | None,
    archives: dict[str, int],
    gc_flag: str | None = None,
) -> dict[str, Any]:
    """The plan file's content from a start's ``report`` (what it chose and why)."""
    return {
        "plan": PLAN_VERSION,
        "models": {
            name: {
                version: {key: entry[key] for key in PLANNED_KEYS if key in entry}
                for version, entry in versions.items()
            }
            for name, versions in report["models"].items()
        },
        "job_queue_size": int(report["job_queue_size"]) if report.get("job_queue_size") else None,
        "max_request_size": (
            int(report["max_request_size"]) if report.get("max_request_size") else None
        ),
        "heap_mib": heap_mib,
        "gc_flag": gc_flag,
        "torch_threads": report["torch_threads"],
        "archives": archives,
        "measured": report.get("measured", {}),
        "device_loads": report.get("device_loads", {}),
        "why": report["why"],
    }


def read_plan(path: Path) -> Plan:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PlanError(f"plan {path} cannot be read: {error}") from None
    if raw.get("plan") != PLAN_VERSION:
        raise PlanError(
            f"plan {path} is not a plan of version {PLAN_VERSION} "
            f"(python -m bert_serve_server size --plan-out writes one)"
        )
    return Plan(
        models=raw["models"],
        job_queue_size=raw.get("job_queue_size"),
        max_request_size=raw.get("max_request_size"),
        heap_mib=raw.get("heap_mib"),
        torch_threads=int(raw["torch_threads"]),
        archives={key: int(size) for key, size in raw.get("archives", {}).items()},
        why=list(raw.get("why", [])),
        gc_flag=raw.get("gc_flag"),
    )


def with_plan(
    properties: dict[str, str], plan: Plan, source: Path, archive_bytes: dict[str, int]
) -> tuple[dict[str, str], list[str]]:
    """``properties`` with the plan's values stated, and what was taken (or not) and why.
    ``archive_bytes``: the size of each ``NAME:VERSION``'s archive here."""
    properties = dict(properties)
    notes = [f"plan {source}: taken as stated, nothing measured that it states"]
    models = served_models(properties)
    for name, versions in models.items():
        for version, entry in versions.items():
            key = f"{name}:{version}"
            planned = plan.models.get(name, {}).get(version)
            if planned is None:
                notes.append(f"plan: {key} is not in the plan: sized here")
                continue
            entry.update(planned)
            if key in plan.archives and archive_bytes.get(key) not in (None, plan.archives[key]):
                notes.append(
                    f"plan: {key}'s archive is {archive_bytes[key]} bytes, the plan's was "
                    f"{plan.archives[key]}: its values are used as stated all the same"
                )
    properties["models"] = json.dumps(models)
    if plan.job_queue_size is not None:
        properties["job_queue_size"] = str(plan.job_queue_size)
    if plan.max_request_size is not None:
        properties["max_request_size"] = str(plan.max_request_size)
    if plan.heap_mib is not None:
        vmargs = properties.get("vmargs", "")
        if plan.gc_flag and gc_flag_in(vmargs) is None:
            vmargs = f"{vmargs} {plan.gc_flag}"
        properties["vmargs"] = f"{vmargs} -Xmx{plan.heap_mib}m".strip()
    return properties, notes


def planned_properties(
    properties: dict[str, str], path: Path, archive_bytes: dict[str, int]
) -> tuple[dict[str, str], int, list[str]]:
    """The config with the plan at ``path`` stated in it, the plan's torch threads, and the
    notes: what was taken, and the reasons the plan was made with."""
    plan = read_plan(path)
    properties, notes = with_plan(properties, plan, path, archive_bytes)
    return properties, plan.torch_threads, notes + [f"plan's reason: {why}" for why in plan.why]


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

    @property
    def precision(self) -> str | None:
        """The start's choice where the archive says ``auto`` (``with_precisions``)."""
        return self.entry.get(PRECISION_KEY)


def served_list(properties: dict[str, str]) -> list[Served]:
    if "models" not in properties:
        raise SizingError(
            "the config has no models= entry: state the models to serve and their settings, "
            'e.g. models={"bert": {"1.0": {"marName": "bert.mar"}}} (docs/configuration.md)'
        )
    if "model_store" not in properties:
        raise SizingError("the config has no model_store=: state the folder of the .mar files")
    try:
        models = served_models(properties)
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
        models = served_models(properties)
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
        memory = measured_memory(
            str(model.mar), model.mar.stat().st_mtime_ns, precision=model.precision
        )
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


@dataclass(frozen=True)
class Resolved:
    """The plan: the config with every derived value filled in, and why."""

    properties: dict[str, str]
    torch_threads: int
    reasons: tuple[str, ...]
    refused: dict[str, str] = field(default_factory=dict)
    """``NAME:VERSION`` -> why that model is left out of ``properties``."""
    device_loads: dict[str, DeviceLoad] = field(default_factory=dict)
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``NAME:VERSION`` -> what the start measured of it (texts/s by batch size, memory)."""


def with_batch_size(
    model: Served, threads: int, machine: Machine, measure_queue: bool
) -> tuple[Served, float | None, list[str]]:
    """The model with its batch size (the config's, else measured) and its rate at that size;
    a rate of None where the archive holds no model or nothing needs measuring."""
    if not holds_a_model(model.mar):
        return (
            model,
            None,
            [
                f"{model.mar.name} holds no model folder: batch size, queue and heap as "
                "TorchServe sets them"
            ],
        )
    if "batchSize" in model.entry and not measure_queue:
        return model, None, []
    stated = "batchSize" in model.entry
    sizes = (int(model.entry["batchSize"]),) if stated else BATCH_SIZES
    mar = model.mar
    rates = measured_rates(
        str(mar), mar.stat().st_mtime_ns, sizes, threads, machine.gpus, model.precision
    )
    if stated:
        return model, rates[sizes[0]], []
    batch_size, why = batch_size_for(rates)
    entry = model.entry | {"batchSize": batch_size}
    return replace(model, entry=entry), rates[batch_size], [why]


def with_precisions(
    models: list[Served], on_gpu: frozenset[str], stated: str | None, refused: dict[str, str]
) -> tuple[list[Served], list[str]]:
    """Each model whose archive says ``precision: auto`` with its precision in its entry
    (``PRECISION_KEY``): the plan's, else ``stated`` (``BERT_SERVE_PRECISION``), else measured
    (``probe.measured_precision``); and why. A model whose measurement fails is refused."""
    kept, reasons = [], []
    for model in models:
        auto = (
            holds_a_model(model.mar)
            and archive_handler_config(model.mar).get("precision", "auto") == "auto"
        )
        if not auto:
            kept.append(
                replace(model, entry={k: v for k, v in model.entry.items() if k != PRECISION_KEY})
            )
            continue
        if stated is not None:
            model, why = replace(model, entry=model.entry | {PRECISION_KEY: stated}), "stated"
        elif model.precision is not None:
            why = "as the plan (or the models= entry) states it"
        else:
            gpus = 1 if model.key in on_gpu else 0
            try:
                choice = measured_precision(str(model.mar), model.mar.stat().st_mtime_ns, gpus)
            except Exception as error:  # the model's own code failed: leave it out
                refused[model.key] = f"{type(error).__name__}: {error}"
                continue
            model = replace(model, entry=model.entry | {PRECISION_KEY: choice.precision})
            why = choice.why
        reasons.append(f"{model.key}: precision auto -> {model.precision}: {why}")
        kept.append(model)
    return kept, reasons


def chosen_precisions(properties: dict[str, str]) -> str:
    """``PRECISION_ENV``'s value for the workers: each model's ``PRECISION_KEY``."""
    return ",".join(
        f"{name}:{version}={entry[PRECISION_KEY]}"
        for name, versions in sorted(served_models(properties).items())
        for version, entry in sorted(versions.items())
        if PRECISION_KEY in entry
    )


def gpu_models(machine: Machine, models: list[Served], refused: dict[str, str]) -> frozenset[str]:
    """The models (not yet ``refused``) whose workers use a GPU; an archive that cannot be read
    is added to ``refused``."""
    on_gpu = set()
    for model in models:
        try:
            if model.key not in refused and runs_on_gpu(machine, model.mar):
                on_gpu.add(model.key)
        except Exception as error:  # not a readable archive
            refused[model.key] = f"{type(error).__name__}: {error}"
    return frozenset(on_gpu)


def each_model(
    models: list[Served], refused: dict[str, str], step: Callable[[Served], Served]
) -> list[Served]:
    """``step`` applied to each model; a model whose own code fails there is added to
    ``refused`` and the others are kept."""
    kept = []
    for model in models:
        try:
            kept.append(step(model))
        except StatedError:
            raise
        except Exception as error:  # the model's own code failed: leave it out, serve the rest
            refused[model.key] = f"{type(error).__name__}: {error}"
    return kept


def resolve(
    properties: dict[str, str], gpus: int | None = None, stated: Stated | None = None
) -> Resolved:
    """``properties`` with what they leave out derived from this machine: each model's
    workers and ``batchSize`` (``models=``), ``job_queue_size`` and the heap (``-Xmx`` in
    ``vmargs``); and the torch threads per worker. Values the config or ``stated`` state are
    kept, and nothing is measured that they decide. A model whose archive cannot be read or
    loaded is left out, with the reason (``refused``)."""
    stated = stated or Stated()
    properties, plain_start = sized_at_start(properties)
    properties, stated_threads, planned = with_plan_of(properties, stated)
    if gpus is None:
        gpus = serving_gpus(properties)
    machine, properties = with_stated(read_machine(gpus), properties, stated)
    models = served_list(properties)
    refused = {m.key: f"{m.mar} is missing" for m in models if not m.mar.is_file()}
    on_gpu = gpu_models(machine, models, refused)
    models = [model for model in models if model.key not in refused]
    models, chosen = with_precisions(models, on_gpu, stated.precision, refused)
    if not on_gpu:
        machine = replace(machine, gpus=0)  # every model on the CPU: sized as on a CPU machine
    workers_sized = {model.key for model in models if "minWorkers" not in model.entry}
    reasons: list[str] = [*machine.source, *stated.lines(), *plain_start, *planned, *chosen]
    stated_queue = int(properties["job_queue_size"]) if "job_queue_size" in properties else None

    def batches(models: list[Served], threads: int) -> BatchSized:
        return batch_sized(models, threads, machine, stated_queue is None, refused)

    threads = stated_threads or 1
    probe = memory_probe(machine, properties, models, stated_threads or 1)
    if models and not on_gpu:
        batched, threads, why = cpu_sized(machine, models, refused, stated_threads, batches, probe)
        reasons += why
    else:
        batched = batches(models, threads)
    sized, rates = batched.models, batched.rates
    loads: dict[str, DeviceLoad] = {}
    if on_gpu:
        sized, loads = with_device_loads(sized, on_gpu, refused, stated_queue is None)
        if sized:
            with probing(probe):
                sized, threads, why = with_workers(machine, sized, loads, on_gpu, stated_threads)
            reasons += why
    reasons += batched.reasons
    resolved = dict(properties)
    holding = [model for model in sized if holds_a_model(model.mar)]
    with probing(replace(probe, threads=threads)):  # the workers as measured above
        if holding and (any(rates.get(m.key) for m in sized) or stated_queue is not None):
            why, resolved = sized_queue(
                machine, resolved, sized, rates, loads, on_gpu, stated_queue
            )
            reasons += why
        measured = measured_of(sized, rates, workers_sized, on_gpu)
    models_entry: dict[str, dict[str, Any]] = {}
    for model in sized:
        models_entry.setdefault(model.name, {})[model.version] = model.entry
    resolved["models"] = json.dumps(models_entry)
    if refused:
        resolved = without(resolved, refused)
    return Resolved(resolved, threads, tuple(reasons), refused, loads, measured)


def measured_of(
    models: list[Served],
    rates: dict[str, float | None],
    workers_sized: set[str],
    on_gpu: frozenset[str],
) -> dict[str, dict[str, Any]]:
    """What was measured of each model: its rate at its batch size, and a worker's memory
    where the start sized its workers (both as measured once, nothing measured again)."""
    measured: dict[str, dict[str, Any]] = {}
    for model in models:
        got: dict[str, Any] = {}
        if rates.get(model.key) is not None:
            got["texts_per_s"] = rates[model.key]
        if model.key in workers_sized:
            got["worker_bytes"], got["worker_bytes_source"] = worker_host_bytes(model, on_gpu)
        if got:
            measured[model.key] = got
    return measured


def with_plan_of(
    properties: dict[str, str], stated: Stated
) -> tuple[dict[str, str], int | None, list[str]]:
    """The config with the stated plan in it (if any), the torch threads stated (the
    environment's, else the plan's), and the notes."""
    if stated.plan is None:
        served_list(properties)  # a config without models is refused before the machine is read
        return properties, stated.threads, []
    properties, threads, notes = planned_properties(
        properties, stated.plan, archive_bytes(properties)
    )
    return properties, stated.threads or threads, notes


def memory_probe(
    machine: Machine, properties: dict[str, str], models: list[Served], threads: int
) -> Probe:
    """What a worker's memory is measured with (``Probe``): ``threads``, each model's
    largest batch (its stated ``batchSize``, else the largest the start chooses), the config's
    ``max_request_size`` (else the handler's largest body, which the start then sets), and the
    most a worker may hold here: the memory less the frontend's least (its non-heap memory, its
    own heap) and the slack."""
    stated = properties.get("max_request_size")
    least_beside = (
        rules.FRONTEND_NON_HEAP_BYTES + rules.SERVER_SLACK_BYTES + rules.BASE_HEAP_MIB * rules.MIB
    )
    return Probe(
        threads=threads,
        batch_sizes=tuple(
            (str(m.mar), int(m.entry["batchSize"])) for m in models if "batchSize" in m.entry
        ),
        max_request_bytes=int(stated) if stated else None,
        cap_bytes=max(0, machine.memory_bytes - least_beside),
    )


def workers_at_their_threads(
    machine: Machine, models: list[Served], stated_threads: int | None, probe: Probe
) -> tuple[list[Served], int, list[str]]:
    """``with_workers`` with each worker's memory measured at the torch threads the plan gives
    it: first at the CPUs paid for shared one worker per core; where the memory then cuts the
    workers (so each gets more threads), measured again at those, until the two agree."""
    guess = stated_threads or threads_for(machine, max(1, math.floor(machine.cores)))
    tried: set[int] = set()
    while True:
        with probing(replace(probe, threads=guess)):
            sized, threads, why = with_workers(machine, models, stated_threads=stated_threads)
            if any("minWorkers" not in model.entry for model in models):  # memory measured
                why += largest_batch_reasons(sized, guess)
        tried.add(guess)
        if threads == guess or threads in tried:
            return sized, threads, why
        guess = threads


def largest_batch_reasons(models: list[Served], threads: int) -> list[str]:
    """What the largest batch added to each worker ``with_workers`` measured (``models``: those
    it measured), and the threads it was measured with (read again, nothing measured twice)."""
    reasons = []
    for model in models:
        if not holds_a_model(model.mar):
            continue
        mtime_ns = model.mar.stat().st_mtime_ns
        memory = measured_memory(str(model.mar), mtime_ns, precision=model.precision)
        batch = getattr(memory, "batch", "")
        if batch.startswith(NOT_MEASURED):
            reasons.append(
                f"{model.key}: WARNING: the largest batch the limits admit is not within a "
                f"worker's budget, {batch}"
            )
        elif batch:
            reasons.append(
                f"{model.key}: a worker measured with {threads} torch thread(s), as the plan "
                f"gives each; the largest batch the limits admit ({memory.batch}) added "
                f"{memory.batch_bytes // rules.MIB} MiB to its peak of "
                f"{memory.peak_bytes // rules.MIB} MiB, decoded and tokenized in "
                f"{memory.batch_s:g} s"
            )
    return reasons


def cpu_workers_or_refused(
    machine: Machine,
    models: list[Served],
    refused: dict[str, str],
    threads: int | None,
    probe: Probe,
) -> tuple[list[Served], int, list[str]]:
    """``with_workers`` on the CPU (``workers_at_their_threads``); where measuring a worker's
    memory fails (the model's own code), that model is refused and the others sized without it."""
    while models:
        try:
            return workers_at_their_threads(machine, models, threads, probe)
        except MeasureError as error:
            refused[error.key] = str(error)
            models = [model for model in models if model.key != error.key]
    return [], threads or 1, []


@dataclass
class BatchSized:
    """The models with their batch sizes, each one's rate there, and why."""

    models: list[Served]
    rates: dict[str, float | None] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def batch_sized(
    models: list[Served],
    threads: int,
    machine: Machine,
    measure_queue: bool,
    refused: dict[str, str],
) -> BatchSized:
    """``with_batch_size`` of each model; one whose own code fails is added to ``refused``."""
    batched = BatchSized([])

    def step(model: Served) -> Served:
        sized, rate, why = with_batch_size(model, threads, machine, measure_queue)
        label = f"{model.key}: " if len(models) > 1 else ""
        batched.reasons.extend(label + reason for reason in why)
        batched.rates[model.key] = rate
        return sized

    batched.models = each_model(models, refused, step)
    return batched


def cpu_sized(
    machine: Machine,
    models: list[Served],
    refused: dict[str, str],
    stated_threads: int | None,
    batches: Callable[[list[Served], int], BatchSized],
    probe: Probe,
) -> tuple[BatchSized, int, list[str]]:
    """On the CPU: the workers and threads (``cpu_workers_or_refused``), then each model's batch
    size (``batches``); a model refused while its rate is measured gives its cores back, the
    workers sized again without it."""
    while True:
        workers, threads, why = cpu_workers_or_refused(
            machine, models, refused, stated_threads, probe
        )
        batched = batches(workers, threads)
        if len(batched.models) == len(workers):
            return batched, threads, why
        models = [model for model in models if model.key not in refused]


def sized_queue(
    machine: Machine,
    properties: dict[str, str],
    models: list[Served],
    rates: dict[str, float | None],
    loads: dict[str, DeviceLoad],
    on_gpu: frozenset[str],
    stated_queue: int | None,
) -> tuple[list[str], dict[str, str]]:
    """``job_queue_size``, ``max_request_size`` and ``-Xmx`` for ``models`` (``rules.derive``),
    with the reasons; a stated ``-Xms`` is a floor for the heap."""
    properties = dict(properties)
    vmargs = properties.get("vmargs", "")
    reasons = []
    holding = [model for model in models if holds_a_model(model.mar)]
    limits = [archive_limits(m.mar) for m in holding]
    largest_body = max(rules.handler_body_bytes(chars, texts) for chars, texts in limits)
    if "max_request_size" in properties:
        max_request = int(properties["max_request_size"])
    else:
        max_request = largest_body
        properties["max_request_size"] = str(max_request)
        reasons.append(
            f"max_request_size {max_request}: the largest body the handler accepts "
            "(max_texts_per_request texts of max_chars characters, JSON-escaped)"
        )
    (workers, rate), why_drain = gpu_capped_drains(machine, models, rates, loads)
    reasons += why_drain
    reserved = 0
    if not heap_stated(vmargs):
        reserved = sum(int(m.entry["minWorkers"]) * worker_host_bytes(m, on_gpu)[0] for m in models)
    gc = rules.jvm_gc(machine, vmargs)
    queue, heap_mib, why = derive(
        machine,
        QueueInputs(
            workers=max(workers, 1),
            texts_per_s=rate,
            request_bytes=max(queued_request_bytes(max_request, *lim) for lim in limits),
            queues=len(holding),
            reserved_bytes=reserved,
            stated_queue=stated_queue,
            stated_heap_mib=heap_mib_in(vmargs, machine.memory_bytes),
            min_heap_mib=heap_mib_in(vmargs, flag=MIN_HEAP_FLAG),
            gc=gc,
            vmargs=vmargs,
        ),
    )
    least = heap_mib_in(vmargs, flag=MIN_HEAP_FLAG)
    stated_heap = heap_mib_in(vmargs, machine.memory_bytes)
    if least is not None and stated_heap is not None and stated_heap < least:
        raise StatedError(
            f"-Xms{least}m is more than the stated heap of {stated_heap} MiB: the JVM refuses to start"
        )
    properties["job_queue_size"] = str(queue)
    if not heap_stated(vmargs):
        pinned = ""
        if gc in rules.GC_FLAG_OF and rules.gc_flag_in(vmargs) is None:
            # The heap holds the queue as this collector holds it: the JVM runs that one even
            # where it sees another machine than the one sized (a stated memory, a CPU request).
            pinned = f" {rules.GC_FLAG_OF[gc]}"
            why.append(
                f"{rules.GC_FLAG_OF[gc]}: the collector the JVM picks on "
                f"{machine.logical_cpus:g} CPUs and {machine.memory_bytes // rules.MIB} MiB "
                f"(G1 from 2 CPUs and {rules.SERVER_CLASS_MEMORY_BYTES // rules.MIB} MiB), "
                "stated so that it is the one the heap was sized for"
            )
        properties["vmargs"] = f"{vmargs}{pinned} -Xmx{heap_mib}m".strip()
    return reasons + why, properties


def gpu_capped_drains(
    machine: Machine,
    models: list[Served],
    rates: dict[str, float | None],
    loads: dict[str, DeviceLoad],
) -> tuple[tuple[int, float], list[str]]:
    """The largest drain among ``models`` as (workers, texts/s per worker), each model's
    workers x rate capped by what its GPUs drain (a batch per measured device time), and
    the reasons where a GPU capped it."""
    drains, reasons = [], []
    for model in models:
        rate = rates.get(model.key)
        if rate is None:
            continue
        workers = int(model.entry["minWorkers"])
        load = loads.get(model.key)
        if load is not None and workers * rate > machine.gpus * load.gpu_texts_per_s:
            drained = machine.gpus * load.gpu_texts_per_s
            reasons.append(
                f"{model.key}: the queue follows what {machine.gpus} GPU(s) drain, "
                f"{drained:.1f} texts/s (a batch of {load.batch_size} per "
                f"{load.gpu_s * 1e3:.2f} ms of the GPU), less than {workers} x {rate:g}"
            )
            rate = drained / workers
        drains.append((workers, rate))
    return max(drains or [(0, 0.0)], key=lambda drain: drain[0] * drain[1]), reasons


def with_device_loads(
    models: list[Served], on_gpu: frozenset[str], refused: dict[str, str], need_queue: bool = True
) -> tuple[list[Served], dict[str, DeviceLoad]]:
    """The models still served, and the ``DeviceLoad`` at its batch size of each whose GPU
    workers the start sizes or whose queue the GPU caps (on a GPU, a model in the archive); a
    model whose measurement fails is added to ``refused``."""
    kept, loads = [], {}
    for model in models:
        sizes_workers = "minWorkers" not in model.entry
        if model.key in on_gpu and holds_a_model(model.mar) and (sizes_workers or need_queue):
            batch_size = int(model.entry.get("batchSize", max(BATCH_SIZES)))
            try:
                loads[model.key] = measured_device_load(
                    str(model.mar), model.mar.stat().st_mtime_ns, batch_size, model.precision
                )
            except Exception as error:  # the model's own code failed: leave it out
                refused[model.key] = f"{type(error).__name__}: {error}"
                continue
        kept.append(model)
    return kept, loads


def report(resolved: Resolved) -> dict[str, Any]:
    """What ``make status`` and the start-up output show: the values in force and why."""
    return {
        "models": json.loads(resolved.properties["models"]),
        "refused": dict(resolved.refused),
        "job_queue_size": resolved.properties.get("job_queue_size"),
        "max_request_size": resolved.properties.get("max_request_size"),
        "vmargs": resolved.properties.get("vmargs", ""),
        "torch_threads": resolved.torch_threads,
        "device_loads": {key: asdict(load) for key, load in resolved.device_loads.items()},
        "measured": resolved.measured,
        "why": list(resolved.reasons),
    }


class UsageError(ValueError):
    pass


def torchserve_config(args: list[str], environ: dict[str, str]) -> dict[str, str]:
    """The config TorchServe would run with ``args``: the last ``--ts-config``, with
    ``--model-store`` over its ``model_store``."""
    if environ.get(TS_CONFIG_ENV):
        raise UsageError(
            f"{TS_CONFIG_ENV}={environ[TS_CONFIG_ENV]} is set: TorchServe reads it in place of "
            "the sized --ts-config, so the sizing would not be what runs; unset it and pass "
            "the config as --ts-config"
        )
    torchserve = argparse.ArgumentParser(add_help=False)
    torchserve.add_argument("--ts-config", type=Path, action="append")
    torchserve.add_argument("--model-store", type=Path)
    given = args[1:] if args[:1] == ["--"] else args
    known = torchserve.parse_known_args(given)[0]
    if not known.ts_config:
        raise UsageError("no --ts-config among TorchServe's arguments: name the config to size")
    config = known.ts_config[-1]
    if not config.is_file():
        raise UsageError(f"--ts-config {config}: no such file")
    properties = read_properties(config)
    if known.model_store is not None:
        properties["model_store"] = str(known.model_store)
    return properties


def archive_bytes(properties: dict[str, str]) -> dict[str, int]:
    """The size of each served model's archive (``NAME:VERSION`` -> bytes), where it exists."""
    return {m.key: m.mar.stat().st_size for m in served_list(properties) if m.mar.is_file()}


def write_plan(path: Path, resolved: Resolved, source: dict[str, str]) -> None:
    vmargs = resolved.properties.get("vmargs", "")
    plan = plan_of(report(resolved), heap_mib_in(vmargs), archive_bytes(source), gc_flag_in(vmargs))
    path.write_text(json.dumps(plan, indent=2) + "\n")


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server size", description=SIZE_USAGE
    )
    parser.add_argument("--out", type=Path, required=True, help="the sized config.properties")
    parser.add_argument("--plan-out", type=Path, help="also write the plan (what was chosen, why)")
    parser.add_argument("--plan", type=Path, help="use this plan as stated (BERT_SERVE_PLAN)")
    parser.add_argument("torchserve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        source = torchserve_config(args.torchserve_args, environ)
        stated = read_stated(environ)
        if args.plan is not None:
            stated = replace(stated, plan=args.plan)
        resolved = resolve(source, stated=stated)
    except (UsageError, SizingError) as error:
        print(f"sizing: {error}", file=sys.stderr)
        return 1
    address = environ.get(INFERENCE_ADDRESS_ENV)
    if address:
        resolved = replace(
            resolved, properties=resolved.properties | {"inference_address": address}
        )
    for key, why in resolved.refused.items():
        print(f"sizing: model {key} refused: {why}", file=sys.stderr)
    if not json.loads(resolved.properties["models"]):
        print("sizing: no model left to serve", file=sys.stderr)
        return 1
    args.out.write_text(properties_text(resolved.properties))
    if args.plan_out is not None:
        write_plan(args.plan_out, resolved, source)
    for reason in resolved.reasons:
        print(f"sizing: {reason}", file=sys.stderr)
    print(resolved.torch_threads)
    print(chosen_precisions(resolved.properties))
    return 0
