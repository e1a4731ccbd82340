"""The server's environment: requirements/server.lock covers pyproject's server and dev extras
within their bounds, the torch build is the one asked for (no CUDA library in a CPU
environment), and `make lock` reports what a new resolution changes."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from bert_serve_server.environment import (
    LOCK,
    build_problems,
    canonical,
    lock_changes,
    lock_text,
    parse_lock,
    pins_from_report,
    uv_arguments,
    wheel_distributions,
    with_torch_build,
)

from tests.conftest import ROOT

REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*(.*)$")


def extras(*names: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [r for name in names for r in project["optional-dependencies"][name]]


def test_the_lock_pins_every_server_and_dev_requirement_within_pyprojects_bounds() -> None:
    from packaging.requirements import Requirement

    pins = parse_lock(LOCK.read_text())
    for line in [
        *extras("server", "dev"),
        *tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"],
    ]:
        requirement = Requirement(line)
        name = canonical(requirement.name)
        assert name in pins, f"{name} is required by pyproject.toml but not locked: make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside pyproject's {requirement.specifier}: make lock"
        )


def test_the_lock_holds_the_cpu_build_of_torch_and_no_cuda_library() -> None:
    pins = parse_lock(LOCK.read_text())
    assert pins["torch"].endswith("+cpu")
    assert build_problems("cpu", pins["torch"], None, pins) == []


def test_the_cuda_constraints_change_only_torch_to_any_build_but_the_cpu_one() -> None:
    lock = (
        "# torch==9+cpu in a comment\nnumpy==2.0\ntorch==2.13.0+cpu\ntorch-model-archiver==0.12.0\n"
    )
    cuda = with_torch_build(lock, "cuda")
    assert cuda.splitlines()[2] == "torch==2.13.0,!=2.13.0+cpu"
    assert cuda.replace("torch==2.13.0,!=2.13.0+cpu", "torch==2.13.0+cpu") == lock
    assert with_torch_build(lock, "cpu") == lock
    with pytest.raises(ValueError, match="gpu"):
        with_torch_build(lock, "gpu")


@pytest.mark.parametrize(
    ("build", "version", "cuda", "names", "problem"),
    [
        ("cpu", "2.13.0+cpu", None, ["numpy", "tritonclient"], None),
        ("cpu", "2.13.0", "13.0", ["nvidia-cublas", "triton"], "is a CUDA build"),
        ("cpu", "2.13.0+cpu", None, ["nvidia_cudnn_cu13"], "nvidia-cudnn-cu13"),
        ("cpu", "2.13.0+cu126", None, [], "is a CUDA build"),
        ("cuda", "2.13.0", "13.0", ["nvidia-cublas"], None),
        ("cuda", "2.13.0", None, ["nvidia-cublas"], None),  # a wheelhouse: no torch.version
        ("cuda", "2.13.0+cu126", None, [], None),
        ("cuda", "2.13.0+cpu", None, [], "not a CUDA build"),
        ("cuda", "2.13.0", None, ["numpy"], "not a CUDA build"),
    ],
)
def test_build_problems(
    build: str, version: str, cuda: str | None, names: list[str], problem: str | None
) -> None:
    problems = build_problems(build, version, cuda, names)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in line for line in problems), problems


def test_this_environment_holds_the_build_it_was_installed_for() -> None:
    """scripts/install.sh records the build it was asked for (TORCH) in the venv; a venv
    without that record is taken as the default, the CPU build."""
    import torch

    marker = Path(sys.prefix) / ".torch-build"
    build = marker.read_text().strip() if marker.is_file() else "cpu"
    names = [dist.metadata["Name"] for dist in importlib.metadata.distributions()]
    assert build_problems(build, torch.__version__, torch.version.cuda, names) == []


def test_a_wheelhouse_is_read_by_its_file_names(tmp_path: Path) -> None:
    for name in (
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "PyYAML-6.0.2-cp311-cp311-x.whl",
        "notes.txt",
    ):
        (tmp_path / name).touch()
    assert wheel_distributions(tmp_path) == {"torch": "2.13.0+cpu", "pyyaml": "6.0.2"}


def test_a_new_lock_says_what_changed_and_refuses_a_cuda_torch() -> None:
    report = {
        "install": [
            {"metadata": {"name": "bert-serve", "version": "0.1.0"}},
            {"metadata": {"name": "PyYAML", "version": "6.0.3"}},
            {"metadata": {"name": "torch", "version": "2.13.0+cpu"}},
            {"metadata": {"name": "tqdm", "version": "4.70.1"}},
        ]
    }
    pins = pins_from_report(report)
    assert pins == {"pyyaml": "6.0.3", "torch": "2.13.0+cpu", "tqdm": "4.70.1"}
    text = lock_text(pins, "3.11")
    assert parse_lock(text) == pins and "Python 3.11" in text
    old = {"pyyaml": "6.0.2", "torch": "2.13.0+cpu", "requests": "2.32.0"}
    assert lock_changes(old, pins) == [
        "~ pyyaml 6.0.2 -> 6.0.3",
        "- requests 2.32.0",
        "+ tqdm 4.70.1",
    ]
    with pytest.raises(ValueError, match="not the CPU build"):
        lock_text({**pins, "torch": "2.13.0"}, "3.11")


def test_a_lock_line_that_is_not_a_pin_is_refused() -> None:
    with pytest.raises(ValueError, match="not a pin"):
        parse_lock("requests>=2\n")


def test_uv_installs_from_the_sources_pip_is_configured_with() -> None:
    """``pip config list`` -> uv's flags: a PIP_* variable wins over the files, a later file
    over an earlier one; settings that are not package sources are left out."""
    listed = """global.cert='/etc/ssl/certs/ca.crt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/more/simple'
global.find-links='/opt/old-wheels'
:env:.find-links='/opt/wheels'
site.find-links='/opt/site-wheels'
site.index-url='https://mirror.example/simple'
global.constraint='/etc/pip/constraints.txt'
:env:.default-timeout='180'
"""
    assert uv_arguments(listed) == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/more/simple",
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/pip/constraints.txt",
    ]  # fmt: skip
    assert uv_arguments("") == []


EXCLUDED_IMPORTS = {"sentence_transformers", "sklearn", "scipy"}
"""The modules of requirements/excludes.txt's packages and of what only they require."""


def test_the_packages_uv_leaves_out_are_imported_nowhere() -> None:
    """scripts/install.sh leaves requirements/excludes.txt's packages out of uv's installs:
    no module of the checkout may import them, nor the packages only they bring."""
    import ast

    excluded = [
        line.split("#", 1)[0].strip()
        for line in (ROOT / "requirements" / "excludes.txt").read_text().splitlines()
    ]
    assert [name for name in excluded if name] == ["sentence-transformers"]
    locked = parse_lock(LOCK.read_text())
    assert {"sentence-transformers", "scikit-learn", "scipy"} <= set(locked), "pins for pip"
    importers = []
    folders = ("bert_serve", "handler", "lab", "scripts", "server", "tests", "deploy")
    for path in (p for folder in folders for p in (ROOT / folder).rglob("*.py")):
        if "build" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(name.split(".")[0] in EXCLUDED_IMPORTS for name in names):
                importers.append(str(path.relative_to(ROOT)))
    assert importers == []
