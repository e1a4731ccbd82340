"""Where things are: the server package users run (server/bert_serve_server) imports neither the
lab (lab/) nor tests/ and is what the image
installs (tests/integration/test_image_step.py runs its image step without the checkout)."""

from __future__ import annotations

import ast
import subprocess
import tomllib
from pathlib import Path

from tests.conftest import ROOT

SERVER = ROOT / "server" / "bert_serve_server"
NOT_IN_THE_SERVER = ("lab", "tests", "harness", "scripts")


def imported_roots(path: Path) -> set[str]:
    """Every top-level package a module imports, at module level or inside a function."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_server_package_imports_neither_the_lab_nor_the_tests() -> None:
    found = {
        path.name: sorted(imported_roots(path) & set(NOT_IN_THE_SERVER))
        for path in sorted(SERVER.glob("*.py"))
    }
    assert len(found) >= 10  # the glob found the package
    assert {name: roots for name, roots in found.items() if roots} == {}


def test_the_lab_is_not_a_module_of_the_server_distribution() -> None:
    server = tomllib.loads((ROOT / "server" / "pyproject.toml").read_text())
    assert server["tool"]["setuptools"]["packages"] == ["bert_serve_server"]
    assert server["project"]["scripts"] == {"bert-serve-server": "bert_serve_server.__main__:main"}
    assert not (ROOT / "harness").exists()


def test_the_image_installs_the_server_package_and_copies_no_module(tmp_path: Path) -> None:
    """scripts/image.sh builds server/'s wheel, the Dockerfile installs it, nothing copies
    Python files into the image or sets PYTHONPATH, and the entrypoint calls the package."""
    image_sh = (ROOT / "scripts" / "image.sh").read_text()
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    entrypoint = (ROOT / "deploy" / "entrypoint.sh").read_text()
    assert "pip wheel" in image_sh and "./server" in image_sh
    assert ".py " not in image_sh.replace("check_torch.py ", "")
    assert "-r /opt/bert-serve/requirements.txt bert-serve-server" in dockerfile
    assert "PYTHONPATH" not in dockerfile and "COPY lib" not in dockerfile
    assert "python3.11 -m bert_serve_server size --out" in entrypoint


def test_the_model_store_holds_only_what_make_package_writes() -> None:
    """Nothing is tracked in model_store/ but the file that keeps the folder: it is `make
    package`'s output (the security test builds its workflow archive in a temporary folder)."""
    tracked = subprocess.run(
        ["git", "ls-files", "model_store"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert tracked.stdout.split() == ["model_store/.gitkeep"]
