"""``make models-start``: several models in one image start within the pod's startup budget
(``python -m lab models-start --image bert-serve-models:test --models 3 --out FILE``).

The image starts as the pod runs it (the TorchServe container's CPUs, the startup probe run in
the container as kubelet runs it) and the probe's seconds are recorded against the Deployment's
``periodSeconds x failureThreshold``. Only the memory is not the pod's as written: the start
keeps the workers within half of it, so ``memory_for`` gives what ``models`` workers of the
image record's measured size need (three do not fit the Deployment's limit).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bert_serve_server.config import ROOT

from lab.image import (
    DEPLOYMENT,
    STARTUP_PROBE,
    Container,
    ImageTestFailed,
    engine_command,
    recorded,
    sized_from,
    sizing_lines,
    torchserve_container,
    wait_started,
)
from lab.report import tool_parser

IMAGE_RECORD = ROOT / "deploy" / "image-test.json"
MEMORY_STEP_MIB = 256


def startup_budget_s(deployment: Path = DEPLOYMENT) -> int:
    """The TorchServe container's startup probe: ``periodSeconds x failureThreshold``."""
    probe = torchserve_container(deployment)["startupProbe"]
    return int(probe["periodSeconds"]) * int(probe["failureThreshold"])


def worker_mib(record: dict[str, Any]) -> int:
    """One worker's budgeted memory as the image record's start measured it."""
    for line in record["sizing"]:
        if match := re.search(r"a worker holds (\d+) MiB", line):
            return int(match.group(1))
    raise ValueError("the image record has no worker memory line")


def memory_for(models: int, worker: int) -> str:
    """The engine's ``--memory`` for ``models`` workers of ``worker`` MiB in half of it."""
    mib = math.ceil(2 * models * worker / MEMORY_STEP_MIB) * MEMORY_STEP_MIB
    return f"{mib}m"


def models_start(
    engine: list[str], image: str, models: int, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Start ``image`` (``models`` models) and time its startup probe; always removed."""
    budget_s = startup_budget_s()
    base = Container.of(engine, image)
    memory = memory_for(models, worker_mib(json.loads(IMAGE_RECORD.read_text())))
    container = replace(base, limits=base.limits | {"memory": memory})
    say(f"start with {container.limits}; the startup probe's budget is {budget_s} s")
    try:
        container.start()
        ready_s = wait_started(
            lambda: container.succeeds("exec", container.name, *STARTUP_PROBE),
            budget_s,
            lambda: container.logs(200),
            lambda: container.state("Running") == "true",
        )
        status, text = container.management("GET", "/models")
        served = sorted(model["modelName"] for model in json.loads(text)["models"])
        sizing = sizing_lines(container)
    finally:
        container.remove()
    say(f"startup probe passed after {ready_s} s: {served}")
    if status != 200 or len(served) != models:
        raise ImageTestFailed(f"{models} models asked for, {served} served")
    return {
        "image": image,
        "limits": container.limits,
        "models": served,
        "ready_s": ready_s,
        "startup_budget_s": budget_s,
        "sizing": sizing,
        "sized_from": sized_from(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("models-start", __doc__)
    parser.add_argument("--image", required=True)
    parser.add_argument("--models", type=int, required=True, help="how many the image serves")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    engine = engine_command()
    return recorded(
        "models-start", args.out, lambda say: models_start(engine, args.image, args.models, say)
    )
