#!/usr/bin/env bash
# Refresh requirements/server.lock: resolve `.[server,dev]` of pyproject.toml afresh, in a
# clean venv of the server's Python with torch's CPU index (scripts/torch_build.sh; TORCH is
# cpu whatever is set, the lock being the CPU environment), write the lock and print what
# changed (bert_serve_server.environment's lock_text and lock_changes). pip resolves without
# installing (--dry-run --report).
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
PYTHONPATH="$PWD/server" "$venv/bin/python" - build/lock/report.json <<'EOF'
import json, pathlib, sys
from bert_serve_server.environment import LOCK, lock_changes, lock_text, parse_lock, pins_from_report
pins = pins_from_report(json.loads(pathlib.Path(sys.argv[1]).read_text()))
try:
    text = lock_text(pins, "%d.%d" % sys.version_info[:2])
except ValueError as error:
    sys.exit(f"lock: {error}")
old = parse_lock(LOCK.read_text()) if LOCK.is_file() else {}
LOCK.write_text(text)
changes = lock_changes(old, pins)
print("\n".join(changes) if changes else "no change")
print(f"{LOCK}: {len(pins)} distributions, {len(changes)} changed")
EOF
