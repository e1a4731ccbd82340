#!/usr/bin/env bash
# The client on every Python it supports (pyproject.toml's requires-python: 3.9 to 3.13). For
# each: a clean venv under build/pythons/, `pip install .` (the client: requests and tqdm) and
# pytest, `bert-serve --help`, and the client's unit tests run against that installed copy
# (--import-mode=importlib with no pythonpath: the checkout's bert_serve/ is not on the path).
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

for version in "${versions[@]}"; do
    python="$(interpreter "$version")" || { echo "no Python $version (pyenv or python$version)" >&2; exit 1; }
    venv="build/pythons/$version"
    echo "== Python $version ($python)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet . "pytest>=8,<10"
    "$venv/bin/python" -m pip check
    "$venv/bin/bert-serve" --help | grep -q classify
    "$venv/bin/pytest" -p no:cacheprovider --import-mode=importlib -o pythonpath= \
        -m "not server_side" -q "${client_tests[@]}"
done
