"""Settings a deployment states at start through environment variables, without rebuilding the
image or its config (a Kubernetes Deployment's ``env``, or a ConfigMap through ``envFrom``).

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
                           stated, nothing measured (``bert_serve_server.plan``)
=========================  ====================================================================

A variable wins over the plan, which wins over the config file; what none states is derived
from the machine. Each stated value is printed with the variable that stated it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from bert_serve_server.machine import PHYSICAL, STATED, Machine, least_memory

PREFIX = "BERT_SERVE_"
QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?|[kKmMgGtT])?[bB]?\s*$")
BINARY = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


class StatedValueError(ValueError):
    pass


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
}


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
    """The machine and config with what the environment states put in (``bert_serve_server.stated``)."""
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
        models = json.loads(properties["models"])
        for versions in models.values():
            for entry in versions.values():
                entry.update(per_model)
        properties["models"] = json.dumps(models)
    return machine, properties
