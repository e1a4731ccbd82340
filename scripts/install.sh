#!/usr/bin/env bash
# Create the virtual environment for developing the project: the server and dev extras at the
# versions of requirements/server.lock, the client (editable), and the checkout itself on the
# venv's path, since the server side's code (handler/, harness/) is not part of the
# installable client and runs from here. Then check the torch build it got.
#   TORCH, TORCH_INDEX  the torch build, cpu (default) or cuda, and its index
#                       (scripts/torch_build.sh). Unset, TORCH keeps the venv's build, so
#                       reinstalling after a change to pyproject.toml keeps a CUDA venv CUDA;
#                       a venv of the other build is made anew.
#   PYTHON              the interpreter; default python3.11, else python3.12 (the server side
#                       supports those two)
set -euo pipefail
venv="${1:-.venv}"
marker="$venv/.torch-build"
TORCH_BUILD_DEFAULT="$(cat "$marker" 2>/dev/null || true)"
source "$(dirname "$0")/torch_build.sh"

python="${PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in python3.11 python3.12 python3; do
        "$candidate" -c '' 2>/dev/null && { python="$candidate"; break; }
    done
fi
"$python" -c 'import sys; assert sys.version_info[:2] in ((3, 11), (3, 12)), f"the server side needs Python 3.11 or 3.12, not {sys.version.split()[0]}"'

if [ -e "$marker" ] && [ "$(cat "$marker")" != "$torch_build" ]; then
    echo "$venv holds the $(cat "$marker") build of torch: making it anew for $torch_build"
    rm -rf "$venv"
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
constraints="$venv/constraints.txt"
torch_constraints "$venv/bin/python" "$constraints"
"$venv/bin/python" -m pip install --quiet "${torch_index_args[@]}" -c "$constraints" -e ".[server,dev]"
site_packages="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pwd > "$site_packages/bert_serve_checkout.pth"
"$venv/bin/python" scripts/check_torch.py "$torch_build"
echo "$torch_build" >"$marker"
"$venv/bin/python" -c 'import torch, transformers, ts; print(f"installed torch {torch.__version__}, transformers {transformers.__version__}")'
