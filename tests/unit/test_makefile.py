"""The Makefile is a thin index over scripts/: every script it names must exist."""

from __future__ import annotations

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
