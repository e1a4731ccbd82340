#!/usr/bin/env bash
# The whole suite, as `make test` and CI run it: unit tests, integration tests against a
# real torchserve on free local ports, and the curl smoke script against that server.
# Every test's time (its fixtures' setup and teardown included) goes to build/test-times.xml
# (JUnit XML): docs/testing.md's profile is read from it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
exec .venv/bin/python -m pytest -ra --durations=25 --junitxml=build/test-times.xml "$@"
