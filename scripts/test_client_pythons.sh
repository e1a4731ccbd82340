#!/usr/bin/env bash
# The client on every Python it supports (pyproject.toml's requires-python: 3.9 to 3.13), side
# by side. For each: a clean venv under build/pythons/, the client's wheel (`pip install .` as
# one build: requests and tqdm) and pytest, `bert-serve --help`, and the client's unit tests
# run against that installed copy (--import-mode=importlib with no pythonpath: the checkout's
# bert_serve/ is not on the path).
# Tests marked server_side read handler/ or PyYAML, which a client install lacks: the whole
# suite (make test) runs them.
#   PYTHONS  the versions to run (default "3.9 3.10 3.11 3.12 3.13"); each is pyenv's newest
#            installed patch of it, else python3.X on PATH. A missing one fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
client_tests=(tests/unit/test_client.py tests/unit/test_client_key.py)
versions=(${PYTHONS:-3.9 3.10 3.11 3.12 3.13})

interpreter() {
    local version
    if command -v pyenv >/dev/null && version="$(pyenv latest "$1" 2>/dev/null)"; then
        echo "$(pyenv root)/versions/$version/bin/python"
    elif "python$1" -c '' 2>/dev/null; then  # not a pyenv shim without that version behind it
        command -v "python$1"
    else
        return 1
    fi
}

# One Python's run, its output to its own log (the runs go side by side: most of their time is
# pip's downloads).
run_one() {
    local version="$1" python="$2" venv="build/pythons/$1"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "$wheel" "pytest>=8,<10"
    "$venv/bin/python" -m pip check
    "$venv/bin/bert-serve" --help | grep -q classify
    # a temporary folder of its own: pytest's shared one under /tmp is pruned by each run, and
    # runs side by side removed each other's folders ("Directory not empty")
    "$venv/bin/pytest" -p no:cacheprovider --import-mode=importlib -o pythonpath= \
        --basetemp "$venv/pytest-tmp" -m "not server_side" -q "${client_tests[@]}"
}

pythons=()
for version in "${versions[@]}"; do
    python="$(interpreter "$version")" || { echo "no Python $version (pyenv or python$version)" >&2; exit 1; }
    pythons+=("$python")
done
# The client built once, as `pip install .` builds it (a pure-Python wheel), from a copy of what
# it is made of: setuptools writes build/ and egg-info folders into the tree it builds, where
# `make install` (which CI runs beside this script) builds too. Each venv installs that wheel.
rm -rf build/pythons/wheel
mkdir -p build/pythons
source_copy="$(mktemp -d)"
trap 'rm -rf "$source_copy"' EXIT
cp -r pyproject.toml README.md bert_serve "$source_copy/"
"${pythons[0]}" -m pip wheel --quiet --no-deps -w build/pythons/wheel "$source_copy"
wheel="$(ls build/pythons/wheel/bert_serve-*.whl)"
pids=()
for i in "${!versions[@]}"; do
    version="${versions[$i]}" python="${pythons[$i]}"
    (set -e; echo "== Python $version ($python)"; run_one "$version" "$python") \
        >"build/pythons/$version.log" 2>&1 &
    pids+=("$!")
done
failed=()
for i in "${!versions[@]}"; do
    wait "${pids[$i]}" || failed+=("${versions[$i]}")
    cat "build/pythons/${versions[$i]}.log"
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "the client failed on Python ${failed[*]}" >&2
    exit 1
fi
