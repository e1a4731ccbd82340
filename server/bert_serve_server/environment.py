"""The server's Python environment: its lock and its torch build.

``requirements/server.lock`` holds the exact versions of ``.[server,dev]`` the suite passed
with, torch as its CPU build (``torch==2.13.0+cpu``). ``make install`` installs pyproject's
extras constrained to it (scripts/install.sh), ``make image`` downloads the image's wheels
under it (scripts/image.sh), ``make lock`` resolves pyproject afresh and rewrites it
(scripts/lock.sh, then ``lock_text`` and ``lock_changes`` here), ``make check`` audits it.

The torch build is chosen, never inherited from the index: ``TORCH=cpu`` (the default) keeps
the lock's ``+cpu`` pin, which only PyTorch's CPU index (or a local copy of its wheel)
satisfies, so a CPU install can fail but never turns into the CUDA build; ``TORCH=cuda``
drops the label (``with_torch_build``), and PyPI's Linux torch, or a CUDA index's, brings
the CUDA runtime with it. ``build_problems`` checks an environment or a wheelhouse against
the build asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bert_serve_server.config import ROOT

LOCK = ROOT / "requirements" / "server.lock"
BUILDS = ("cpu", "cuda")
CPU_LABEL = "cpu"
PROJECT = "bert-serve"
# What a CUDA build of torch brings: the nvidia-* runtime wheels, cuda-bindings and the like,
# and the Triton compiler (not tritonclient, a dev dependency).
CUDA_PREFIXES = ("nvidia-", "cuda-")
CUDA_NAMES = frozenset({"triton", "pytorch-triton"})
LOCK_HEADER = """\
# The server's environment, `.[server,dev]` of pyproject.toml, at the versions the suite passed
# with: `make install` installs pyproject's extras constrained to these (scripts/install.sh),
# `make image` downloads the image's wheels under them, `make lock` rewrites this file from a
# fresh resolution and prints what changed, `make check` audits it (pip-audit).
# torch is the CPU build; TORCH=cuda installs the same version's CUDA build instead.
# Resolved for Python {python} on Linux x86_64.
"""


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them: ``PyYAML`` -> ``pyyaml``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> dict[str, str]:
    """``name==version`` lines (comments and blank lines skipped) -> {canonical name: version}."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version:
            raise ValueError(f"not a pin (name==version): {raw!r}")
        pins[canonical(name.strip())] = version.strip()
    return pins


def pins_from_report(report: Mapping[str, Any]) -> dict[str, str]:
    """The distributions of a ``pip install --dry-run --report`` (the project itself left out)."""
    pins = {
        canonical(item["metadata"]["name"]): str(item["metadata"]["version"])
        for item in report["install"]
    }
    pins.pop(PROJECT, None)
    return pins


def lock_text(pins: Mapping[str, str], python: str) -> str:
    """The lock file: its header, then one sorted ``name==version`` line per distribution.
    Refuses a torch that is not the CPU build: the lock is the CPU environment."""
    torch = pins.get("torch")
    if torch is None or local_label(torch) != CPU_LABEL:
        raise ValueError(
            f"resolved torch {torch}, not the CPU build (+{CPU_LABEL}): was PyTorch's CPU "
            "index (TORCH_INDEX) reachable, or a local copy of its wheel?"
        )
    lines = [f"{name}=={pins[name]}\n" for name in sorted(pins)]
    return LOCK_HEADER.format(python=python) + "".join(lines)


def lock_changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """What a new lock changes, one line per distribution: added, removed, or old -> new."""
    changes = []
    for name in sorted(old.keys() | new.keys()):
        if name not in old:
            changes.append(f"+ {name} {new[name]}")
        elif name not in new:
            changes.append(f"- {name} {old[name]}")
        elif old[name] != new[name]:
            changes.append(f"~ {name} {old[name]} -> {new[name]}")
    return changes


def local_label(version: str) -> str | None:
    """``2.13.0+cpu`` -> ``cpu``; ``2.13.0`` -> None."""
    return version.partition("+")[2] or None


def with_torch_build(lock: str, build: str) -> str:
    """The lock as constraints for that build: as it is for cpu; for cuda, torch's version
    with any label but ``+cpu``, which the CUDA wheels (PyPI's ``2.13.0``, ``2.13.0+cu126``)
    match and a local CPU wheel does not."""
    if build not in BUILDS:
        raise ValueError(f"torch build {build!r}: expected one of {', '.join(BUILDS)}")
    if build == "cpu":
        return lock
    return re.sub(
        rf"^torch==([^+\s]+)\+{CPU_LABEL}$",
        rf"torch==\1,!=\1+{CPU_LABEL}",
        lock,
        flags=re.MULTILINE,
    )


def is_cuda_distribution(name: str) -> bool:
    name = canonical(name)
    return name.startswith(CUDA_PREFIXES) or name in CUDA_NAMES


def build_problems(
    build: str, torch_version: str, torch_cuda: str | None, names: Iterable[str]
) -> list[str]:
    """What is wrong with an environment (or a wheelhouse) for the torch build asked for:
    ``torch_cuda`` is ``torch.version.cuda`` (None when unknown, as in a wheelhouse), ``names``
    the distributions present. Empty when it is right."""
    cuda_names = sorted({canonical(name) for name in names if is_cuda_distribution(name)})
    label = local_label(torch_version)
    if build == "cpu":
        problems = []
        if torch_cuda is not None or (label is not None and label != CPU_LABEL):
            problems.append(f"torch {torch_version} is a CUDA build (CUDA {torch_cuda})")
        if cuda_names:
            problems.append(f"CUDA libraries in a CPU environment: {', '.join(cuda_names)}")
        return problems
    if build == "cuda":
        if label == CPU_LABEL or not (torch_cuda or cuda_names or (label or "").startswith("cu")):
            return [f"torch {torch_version} is not a CUDA build"]
        return []
    raise ValueError(f"torch build {build!r}: expected one of {', '.join(BUILDS)}")


def wheel_distributions(wheelhouse: Path) -> dict[str, str]:
    """{canonical name: version} of the wheels in a folder (``name-version-tags.whl``)."""
    wheels = {}
    for wheel in wheelhouse.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        wheels[canonical(name)] = version
    return wheels


# pip's settings that decide where packages come from, and uv's flag for each
PIP_SOURCE_FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def uv_arguments(pip_config_list: str) -> list[str]:
    """``uv pip install`` flags for the package sources pip is configured with, from ``pip
    config list``: ``--find-links /opt/wheels ...``, so that uv installs from where pip would
    (uv reads no pip.conf). As in pip, a ``PIP_*`` variable (``:env:``) wins over the files,
    and a later file over an earlier one."""
    chosen: dict[str, list[str]] = {}
    from_env: set[str] = set()
    for line in pip_config_list.splitlines():
        key, sep, quoted = line.partition("=")
        name = key.rpartition(".")[2]
        if not sep or name not in PIP_SOURCE_FLAGS or name in from_env:
            continue
        chosen[name] = quoted.strip().strip("'\"").split()
        if key.startswith(":env:"):
            from_env.add(name)
    return [
        part
        for name in PIP_SOURCE_FLAGS
        for value in chosen.get(name, [])
        for part in (PIP_SOURCE_FLAGS[name], value)
    ]
