"""The Makefile is a thin index over scripts/: every script it names must exist."""

from __future__ import annotations

import ast
import importlib
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


def pages() -> dict[str, str]:
    found = {"Makefile": (ROOT / "Makefile").read_text()}
    for path in [*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("*/README.md")]:
        found[str(path.relative_to(ROOT))] = path.read_text()
    return found


def test_every_lab_tool_and_script_a_page_names_exists() -> None:
    """`python -m lab NAME` (or the Makefile's `$(LAB) NAME`) names a tool of lab/__main__.py,
    each with a `main`; every `scripts/...` file a page or the Makefile names is there."""
    from lab.__main__ import TOOLS

    named, missing = set(), []
    for page, text in pages().items():
        for tool in re.findall(r"(?:-m lab|\$\(LAB\)) ([a-z][\w-]*)", text):
            named.add(tool)
            if tool not in TOOLS:
                missing.append(f"{page}: python -m lab {tool}")
        for path in re.findall(r"scripts/[\w./-]+\.(?:py|sh)", text):
            if not (ROOT / path).is_file():
                missing.append(f"{page}: {path}")
    assert not missing, missing
    assert {"bench", "chaos", "gpu-report", "image-test", "pod-test"} <= named
    for module in TOOLS.values():
        assert callable(importlib.import_module(module).main), module


def test_every_make_target_a_page_names_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    missing = [
        f"{page}: make {target}"
        for page, text in pages().items()
        if page != "Makefile"
        for target in re.findall(r"`make ([a-z][\w-]*)", text)
        if target not in targets
    ]
    assert not missing, missing
