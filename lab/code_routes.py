"""A real workflow archive, to probe TorchServe's routes that can load code: the image test
and tests/integration/test_security.py check each stays shut (docs/security.md).

A workflow archive (``.war``) carries a Python handler that TorchServe imports in a worker
when the workflow is registered and calls on ``/wfpredict/{name}``. The one built here writes
a marker file at import and at call, so a test can tell whether its code ever ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORKFLOW_NAME = "probe_wf"

HANDLER = """\
import pathlib

pathlib.Path({marker!r}).mkdir(parents=True, exist_ok=True)
pathlib.Path({marker!r}, "imported").write_text("the workflow's code ran at import")


def pre(data, context):
    pathlib.Path({marker!r}, "called").write_text("the workflow's code ran at call")
    return data
"""
SPEC = """\
models:
  min-workers: 1
  max-workers: 1
  batch-size: 1
  m1:
    url: {model}
dag:
  pre: [m1]
"""


@dataclass(frozen=True)
class WorkflowArchive:
    path: Path
    marker_dir: Path
    """Where the archive's code writes ``imported`` and ``called`` if it ever runs."""

    @property
    def ran(self) -> list[str]:
        if not self.marker_dir.is_dir():
            return []
        return sorted(path.name for path in self.marker_dir.iterdir())


def archiver_command() -> str:
    return (
        shutil.which("torch-workflow-archiver", path=str(Path(sys.executable).parent))
        or "torch-workflow-archiver"
    )


def build_workflow_archive(out: Path, marker_dir: Path, model: str = "bert.mar") -> WorkflowArchive:
    """``out/probe_wf.war`` made by ``torch-workflow-archiver`` from a four-line handler and a
    spec that names ``model`` (a .mar of the store), as an attacker would make it."""
    source = out / "source"
    source.mkdir(parents=True)
    (source / "handler.py").write_text(HANDLER.format(marker=str(marker_dir)))
    (source / "spec.yaml").write_text(SPEC.format(model=model))
    # The archiver copies its inputs into TMPDIR/<workflow name> and deletes that folder first.
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [archiver_command(), "--workflow-name", WORKFLOW_NAME, "--spec-file", "spec.yaml"]
            + ["--handler", "handler.py", "--export-path", str(out), "--force"],
            cwd=source,
            env=dict(os.environ, TMPDIR=scratch),
            check=True,
            capture_output=True,
            timeout=120,
        )
    return WorkflowArchive(out / f"{WORKFLOW_NAME}.war", marker_dir)
