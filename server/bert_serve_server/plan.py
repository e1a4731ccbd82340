"""A saved plan: what one start chose and why, in a file a later start (or every replica of a
Deployment, from a ConfigMap) takes as stated, so a fleet runs one plan measured once per kind
of node and a restart cannot change it.

``python -m bert_serve_server size --plan-out plan.json -- --ts-config config.properties`` writes
one; ``BERT_SERVE_PLAN=plan.json`` (or ``size --plan plan.json``) uses it: each model's workers
and ``batchSize``, ``job_queue_size``, ``max_request_size``, the heap and the torch threads are
put into the config as stated, and nothing is measured. A model of the config that the plan
does not hold is sized as usual, and said so; an archive that differs from the one the plan
was measured on (its size) is said so too. Environment variables still win over the plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_serve_server.rules import gc_flag_in

PLAN_VERSION = 1
MODEL_KEYS = ("minWorkers", "maxWorkers", "batchSize")


class PlanError(ValueError):
    pass


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
    """The plan file's content from a start's ``sizing.report`` (what it chose and why)."""
    return {
        "plan": PLAN_VERSION,
        "models": {
            name: {
                version: {key: entry[key] for key in MODEL_KEYS if key in entry}
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
    models = json.loads(properties.get("models", "{}"))
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
