"""The image's start step (``python -m bert_serve_server size``) runs from the server package
alone: no checkout on the path, so no handler/, lab/ or tests/, as in the image."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import MAR_PATH, ROOT


def test_the_images_sizing_step_runs_from_the_server_package_alone(tmp_path: Path) -> None:
    """As in the image: only server/ on the path (no checkout, so no handler/, lab/ or tests/),
    ``python -m bert_serve_server size`` writes the sized config and prints the threads."""
    shutil.copy(MAR_PATH, tmp_path / "bert.mar")
    config = tmp_path / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:8080\n"
        f"model_store={tmp_path}\n"
        'models={"bert": {"1.0": {"marName": "bert.mar", "batchSize": 8, "maxBatchDelay": 5, '
        '"minWorkers": 1, "maxWorkers": 1}}}\n'
    )
    isolate = (
        "import runpy, sys;"
        f"sys.path = [p for p in sys.path if os.path.realpath(p or '.') != {str(ROOT)!r}];"
        "sys.argv = ['bert_serve_server', 'size', '--out', sys.argv[1], '--', '--ts-config', sys.argv[2]];"
        "[sys.modules.pop(name, None) for name in list(sys.modules) if name.split('.')[0] in ('lab', 'handler', 'tests')];"
        "runpy.run_module('bert_serve_server', run_name='__main__')"
    )
    out = tmp_path / "sized.properties"
    result = subprocess.run(
        [sys.executable, "-c", "import os;" + isolate, str(out), str(config)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "server")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    threads, precisions = result.stdout.splitlines()
    assert int(threads) >= 1
    assert precisions == "bert:1.0=fp32", "the suite states fp32 (tests/conftest.py)"
    assert "job_queue_size=" in out.read_text()
