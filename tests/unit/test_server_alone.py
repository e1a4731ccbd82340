"""Every module of the server package imports, and every command the image can run starts,
with only server/ on the path: no checkout, so no handler/, lab/ or tests/, as in the image
(deploy/Dockerfile installs the server package alone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SERVER = ROOT / "server" / "bert_serve_server"
MODULES = sorted(path.stem for path in SERVER.glob("*.py") if path.stem != "__main__")

# The checkout's root off the path, its packages unimportable: what the image's Python sees.
ISOLATE = (
    "import os, runpy, sys;"
    f"sys.path = [p for p in sys.path if os.path.realpath(p or '.') != {str(ROOT)!r}];"
    "[sys.modules.pop(n, None) for n in list(sys.modules) if n.split('.')[0] in"
    " ('lab', 'handler', 'tests')];"
    "import importlib.abc\n"
    "class Absent(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name.split('.')[0] in ('lab', 'handler', 'tests'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
    "sys.meta_path.insert(0, Absent())\n"
)


def alone(code: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ISOLATE + code],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT / "server"), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_isolation_hides_the_handler(tmp_path: Path) -> None:
    """The check below can fail: the handler is not importable under it."""
    result = alone("import handler.settings", tmp_path)
    assert result.returncode != 0 and "No module named 'handler" in result.stderr


def test_every_server_module_imports_without_the_checkout(tmp_path: Path) -> None:
    assert {"control", "ready", "sizing", "archive"} <= set(MODULES)
    code = "".join(f"import bert_serve_server.{name};" for name in MODULES)
    result = alone(code, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("args", "expected_rc", "expected"),
    [
        (["status"], 1, "not running"),
        (["url"], 0, "http://127.0.0.1:8080"),
        (["predict-url"], 0, "http://127.0.0.1:8080/predictions/bert"),
        (["models"], 0, "bert"),
        (["key"], 0, ""),
        (["stop"], 0, "TorchServe is not running"),
        (["--help"], 0, "ready"),
        (["package", "--model-dir", "x"], 2, "needs the checkout"),
    ],
)
def test_the_images_commands_run_on_its_state(
    tmp_path: Path, args: list[str], expected_rc: int, expected: str
) -> None:
    """In the image the state folder is the home folder with the sized config (the entrypoint
    writes it; BERT_SERVE_STATE_DIR names it): the commands read it, none needs the handler."""
    (tmp_path / "config.properties").write_text(
        "inference_address=http://127.0.0.1:8080\n"
        "management_address=http://127.0.0.1:8081\n"
        f"model_store={tmp_path}\n"
        'models={"bert": {"1.0": {"marName": "bert.mar"}}}\n'
    )
    code = f"sys.argv = ['bert_serve_server', *{args!r}];runpy.run_module('bert_serve_server', run_name='__main__')"
    result = alone(code, tmp_path, {"BERT_SERVE_STATE_DIR": str(tmp_path)})
    assert result.returncode == expected_rc, result.stderr
    assert expected in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
