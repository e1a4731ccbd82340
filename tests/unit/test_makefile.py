"""The Makefile is a thin index over scripts/: every script it names must exist."""

from __future__ import annotations

import ast
import re

from tests.conftest import ROOT


def test_every_script_the_makefile_calls_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    named = set(re.findall(r"scripts/[\w./-]+\.(?:py|sh)", makefile))
    assert named, "the Makefile names no scripts"
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"the Makefile calls scripts that do not exist: {missing}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.count("make check") == 1 and ci.count("make test\n") == 1
    assert ci.count("make test-client") == 1, "CI runs the client's tests on every Python"


def test_the_default_models_build_imports_nothing_from_the_lab() -> None:
    """`make serve` trains the default model (`python -m training`) and writes its reference
    texts: the training package is the build's, and imports no lab, tests or scripts module."""
    makefile = (ROOT / "Makefile").read_text()
    assert "-m training model --out build/bert-sentiment" in makefile
    assert "-m training reference --out" in makefile
    imported = set()
    for path in (ROOT / "training").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert not imported & {"lab", "tests", "scripts"}, imported
