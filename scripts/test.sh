#!/usr/bin/env bash
# The whole suite, as `make test` and CI run it:
# - the unit layer (every test not marked integration) in random order (pytest-randomly: the
#   header prints the seed; `--randomly-seed=N` repeats it) over one pytest-xdist process per
#   CPU, at most 4, a process out of tests taking some of another's (--dist worksteal);
# - the integration layer (real torchserve instances on free local ports, the smoke script, the
#   image): every test not marked `alone` over one process per CPU, at most 4, each file whole
#   on one, its servers' torch threads waiting passively (OMP_WAIT_POLICY: the servers share
#   the CPUs); then the `alone` tests (chaos, the image and pod, the operating run, the
#   defaults' bars) in file order on one process, as shipped: they check what it does under load.
# With no arguments and a container engine, the image test's two images are built from the
# start, beside the rest (output: build/image-build.log; the test takes them from
# BERT_SERVE_TEST_IMAGES; run any other way, it builds them itself); the `alone` run waits for
# the build. With no arguments, the shipped archive is then measured on one thread
# (build/measure.log), as a start on the shipped config measures it, in fp32 as
# tests/conftest.py pins every start. Each test's time goes to build/test-times-unit.xml,
# build/test-times.xml and build/test-times-alone.xml (docs/testing.md). Arguments go to every
# run (a run that selects no test is not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
# One measurement cache for every run (tests/conftest.py makes one per run where none is set)
made_cache=""
if [ -z "${BERT_SERVE_MEASURE_CACHE:-}" ]; then
    BERT_SERVE_MEASURE_CACHE="$(mktemp -d -t bert-serve-measured-XXXXXX)"
    export BERT_SERVE_MEASURE_CACHE
    made_cache=1
fi
build=""
engine=()
images=()
cleanup() {
    [ -z "$made_cache" ] || rm -rf "$BERT_SERVE_MEASURE_CACHE"
    if [ -n "$build" ]; then
        kill "$build" 2>/dev/null
        "${engine[@]}" rmi --force "${images[@]}" >/dev/null 2>&1
    fi
    return 0
}
trap cleanup EXIT
pytest=(.venv/bin/python -m pytest -ra --durations=25)
if [ "$#" -eq 0 ] && engine_line="$(bash scripts/container_engine.sh 2>/dev/null)"; then
    read -ra engine <<<"$engine_line"
    tag="test-$$"
    images=("bert-serve:$tag" "bert-serve-proxy:$tag")
    export BERT_SERVE_TEST_IMAGES="${images[*]}"
    export BERT_SERVE_TEST_IMAGE_LOG="$PWD/build/image-build.log"
    # its own process group (timeout's), killed whole past the image test's 30 minutes
    timeout --kill-after=30 1800 make --no-print-directory image IMAGE="${images[0]}" \
        PROXY_IMAGE="${images[1]}" >"$BERT_SERVE_TEST_IMAGE_LOG" 2>&1 &
    build=$!
fi
[ "$#" -ne 0 ] || BERT_SERVE_PRECISION="${BERT_SERVE_PRECISION:-fp32}" .venv/bin/python -m \
    bert_serve_server size --out build/measured.properties -- --ts-config config/config.properties \
    >build/measure.log 2>&1 || echo "test.sh: measuring bert.mar failed (build/measure.log)" >&2
"${pytest[@]}" -m "not integration" -n auto --maxprocesses 4 --dist worksteal \
    --junitxml=build/test-times-unit.xml "$@"
unit=$?
integration_args=("${@:-tests/integration}")  # collecting only that folder: 6 s less a run
OMP_WAIT_POLICY=PASSIVE "${pytest[@]}" -m "integration and not alone" -p no:randomly -n auto \
    --maxprocesses 4 --dist loadfile --junitxml=build/test-times.xml "${integration_args[@]}"
integration=$?
if [ -n "$build" ]; then
    BERT_SERVE_TEST_IMAGE_STATUS=0
    wait "$build" || BERT_SERVE_TEST_IMAGE_STATUS=$?
    export BERT_SERVE_TEST_IMAGE_STATUS
fi
"${pytest[@]}" -m "integration and alone" -p no:randomly --junitxml=build/test-times-alone.xml \
    "${integration_args[@]}"
alone=$?
for status in "$unit" "$integration" "$alone"; do
    # 5: no test selected (arguments that name only one layer's tests)
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
        exit "$status"
    fi
done
if [ "$unit" -eq 5 ] && [ "$integration" -eq 5 ] && [ "$alone" -eq 5 ]; then
    echo "no test selected" >&2
    exit 5
fi
