#!/usr/bin/env bash
# The whole suite, as `make test` and CI run it: unit tests, integration tests against a
# real torchserve on free local ports, and the curl smoke script against that server.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -ra --durations=12 "$@"
