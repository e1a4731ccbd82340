#!/usr/bin/env bash
# Create the virtual environment for developing the project: the server and dev extras at the
# versions of requirements/server.lock (uv leaves out requirements/excludes.txt's), the client
# and the server package (server/), both editable, and the checkout itself on the venv's path,
# since handler/ and the lab (lab/) are not installable and run from here. Then check the
# torch build it got.
#   TORCH, TORCH_INDEX  the torch build, cpu (default) or cuda, and its index
#                       (scripts/torch_build.sh). Unset, TORCH keeps the venv's build, so
#                       reinstalling after a change to pyproject.toml keeps a CUDA venv CUDA;
#                       a venv of the other build is made anew.
#   PYTHON              the interpreter; default python3.11, else python3.12 (the server side
#                       supports those two)
#   INSTALLER           uv (the default: uv on PATH, else uv==$UV_VERSION put into the venv
#                       by the interpreter's pip; it installs from the sources pip is
#                       configured with) or pip (also where uv cannot be had). Same lock.
set -euo pipefail
UV_VERSION=0.13.9  # the uv that INSTALLER=uv installs where none is on PATH
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
# without pip: uv installs the lock (pip among it) in a fraction of the time ensurepip takes
[ -x "$venv/bin/python" ] || "$python" -m venv --without-pip "$venv"
constraints="$venv/constraints.txt"
torch_constraints "$venv/bin/python" "$constraints"
installer="${INSTALLER:-uv}"
uv="$(command -v uv || true)"
if [ "$installer" = uv ] && [ -z "$uv" ]; then
    uv="$venv/bin/uv"
    [ -x "$uv" ] || "$python" -m pip install --quiet --prefix "$venv" "uv==$UV_VERSION" || {
        echo "note: uv could not be installed: installing with pip" >&2
        installer=pip
    }
fi
case "$installer" in
    uv)
        # uv reads no pip.conf: the sources pip is configured with, as uv flags
        mapfile -t pip_sources < <(PYTHONPATH="$PWD/server" "$venv/bin/python" -c 'import subprocess, sys
from bert_serve_server.environment import uv_arguments
listed = subprocess.run([sys.argv[1], "-m", "pip", "config", "list"], capture_output=True, text=True)
print(*uv_arguments(listed.stdout), sep="\n")' "$python")
        # UV_EXCLUDE, not --excludes: a uv on PATH too old for it installs them instead of failing
        UV_EXCLUDE="$PWD/requirements/excludes.txt" "$uv" pip install --quiet \
            --python "$venv/bin/python" --index-strategy unsafe-best-match "${pip_sources[@]}" \
            "${torch_index_args[@]}" -c "$constraints" -e ".[server,dev]" -e ./server
        ;;
    pip)
        "$venv/bin/python" -m pip --version >/dev/null 2>&1 || "$venv/bin/python" -m ensurepip --upgrade >/dev/null
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet "${torch_index_args[@]}" -c "$constraints" -e ".[server,dev]" -e ./server
        ;;
    *) echo "INSTALLER=$installer: expected uv or pip" >&2; exit 2 ;;
esac
site_packages="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pwd > "$site_packages/bert_serve_checkout.pth"
# Every installed module compiled once, here, whichever installer ran and whatever it had
# installed before: where PYTHONDONTWRITEBYTECODE is set nothing else writes bytecode, and every
# process that imports torch and transformers (each worker, measurement, tool) compiled their
# sources anew, about 10 s of CPU each on 2 cores. Files already compiled are skipped; a file
# that does not compile (a package's template or test data) is left as it is.
"$venv/bin/python" -m compileall -q -j 0 "$site_packages" >/dev/null 2>&1 || true
"$venv/bin/python" scripts/check_torch.py "$torch_build"
echo "$torch_build" >"$marker"
"$venv/bin/python" -c 'from importlib.metadata import version; print("installed", ", ".join(f"{name} {version(name)}" for name in ("torch", "transformers", "torchserve")))'
