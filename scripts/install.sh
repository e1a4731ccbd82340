#!/usr/bin/env bash
# Create the virtual environment for developing the project: the client (editable) with the
# server and dev extras, and the checkout itself on the venv's path, since the server side's
# code (handler/, harness/) is not part of the installable client and runs from here.
# torch is pinned to 2.13.0 in pyproject.toml: that CPU build is what pip finds here;
# an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
venv="${1:-.venv}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required"'
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[server,dev]"
site_packages="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pwd > "$site_packages/bert_serve_checkout.pth"
"$venv/bin/python" -c 'import torch, transformers, ts; print(f"installed torch {torch.__version__}, transformers {transformers.__version__}")'
