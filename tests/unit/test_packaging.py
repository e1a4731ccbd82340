"""The client is only a client: what `pip install .` declares, and what `import bert_serve`
loads. (tests/integration/test_client_install.py installs it into a clean venv.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

from tests.conftest import ROOT

SERVER_SIDE = (
    "torch",
    "transformers",
    "ts",
    "aiohttp",
    "psutil",
    "yaml",
    "bert_serve_server",
    "lab",
    "handler",
)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_distribution_is_the_client_and_the_server_side_an_extra() -> None:
    project = pyproject()["project"]
    names = [requirement.split(">")[0].split("=")[0] for requirement in project["dependencies"]]
    assert names == ["requests", "tqdm"]
    assert pyproject()["tool"]["setuptools"]["packages"] == ["bert_serve"]
    server = project["optional-dependencies"]["server"]
    assert "torch==2.13.0" in server  # unpinned, pip would pull a multi-GB CUDA build
    assert {"torchserve==0.12.0", "torch-model-archiver==0.12.0"} <= set(server)
    assert '".[server,dev]"' in (ROOT / "scripts" / "install.sh").read_text()


def test_importing_the_client_and_its_command_loads_nothing_of_the_server() -> None:
    """In this venv torch, aiohttp, the server package and the lab are all importable: none may come along."""
    code = (
        "import json, sys\n"
        "import bert_serve, bert_serve.cli, bert_serve.client\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({SERVER_SIDE!r}))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_the_client_pythons_script_runs_every_python_requires_python_allows() -> None:
    """requires-python and scripts/test_client_pythons.sh (CI's client runs) name the same
    versions: a version allowed but never tested, or tested but refused, fails here."""
    from packaging.specifiers import SpecifierSet

    allowed = SpecifierSet(pyproject()["project"]["requires-python"])
    supported = [f"3.{minor}" for minor in range(30) if f"3.{minor}.0" in allowed]
    script = (ROOT / "scripts" / "test_client_pythons.sh").read_text()
    (default,) = re.findall(r"\$\{PYTHONS:-([\d. ]+)\}", script)
    assert default.split() == supported == ["3.9", "3.10", "3.11", "3.12", "3.13"]
