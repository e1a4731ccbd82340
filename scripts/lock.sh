#!/usr/bin/env bash
# Refresh requirements/server.lock: resolve `.[server,dev]` of pyproject.toml afresh, in a
# clean venv of the server's Python with torch's CPU index (scripts/torch_build.sh; TORCH is
# cpu whatever is set, the lock being the CPU environment), write the lock and print what
# changed (scripts/lock.py). pip resolves without installing (--dry-run --report).
#   PYTHON  the interpreter the lock is for (default python3.11: the Python CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=cpu
source scripts/torch_build.sh
python="${PYTHON:-python3.11}"
venv=build/lock/venv
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --dry-run --ignore-installed \
    --report build/lock/report.json "${torch_index_args[@]}" ".[server,dev]"
PYTHONPATH="$PWD:$PWD/server" "$venv/bin/python" scripts/lock.py build/lock/report.json
