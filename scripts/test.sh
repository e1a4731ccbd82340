#!/usr/bin/env bash
# The whole suite, as `make test` and CI run it, in the runs docs/testing.md describes (unit;
# integration, with the `image` test beside it; then the `alone` tests). With no arguments the
# shipped archive is measured beside the unit layer (build/measure.log) for the starts after it,
# and with a container engine the image test's images are built beside the integration layer
# (build/image-build.log, BERT_SERVE_TEST_IMAGES*) before it runs there (build/test-image.log);
# else it builds them itself, last. Test times: build/test-times*.xml. Arguments go to every
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
build="" measure="" integration_run="" engine=() images=()
cleanup() {
    kill $measure $integration_run 2>/dev/null
    [ -z "$made_cache" ] || rm -rf "$BERT_SERVE_MEASURE_CACHE"
    if [ -n "$build" ]; then
        kill "$build" 2>/dev/null
        "${engine[@]}" rmi --force "${images[@]}" >/dev/null 2>&1
    fi
    return 0
}
trap cleanup EXIT
pytest=(.venv/bin/python -m pytest -ra --durations=25)
if [ "$#" -eq 0 ]; then  # in fp32, as tests/conftest.py pins the suite's starts
    BERT_SERVE_PRECISION="${BERT_SERVE_PRECISION:-fp32}" .venv/bin/python -m bert_serve_server \
        size --out build/measured.properties -- --ts-config config/config.properties \
        >build/measure.log 2>&1 &
    measure=$!
fi
"${pytest[@]}" -m "not integration" -n auto --maxprocesses 4 --dist worksteal \
    --junitxml=build/test-times-unit.xml "$@"
unit=$?
[ -z "$measure" ] || wait "$measure" || echo "test.sh: measuring bert.mar failed (build/measure.log)" >&2
measure=""
if [ "$#" -eq 0 ] && engine_line="$(bash scripts/container_engine.sh 2>/dev/null)"; then
    read -ra engine <<<"$engine_line"
    images=("bert-serve:test-$$" "bert-serve-proxy:test-$$")
    export BERT_SERVE_TEST_IMAGES="${images[*]}"
    export BERT_SERVE_TEST_IMAGE_LOG="$PWD/build/image-build.log"
    # its own process group (timeout's), killed whole past the image test's 30 minutes
    timeout --kill-after=30 1800 make --no-print-directory image IMAGE="${images[0]}" \
        PROXY_IMAGE="${images[1]}" >"$BERT_SERVE_TEST_IMAGE_LOG" 2>&1 &
    build=$!
fi
"${pytest[@]}" -m "integration and not alone and not image" -p no:randomly -n auto \
    --maxprocesses 4 --dist loadfile --junitxml=build/test-times.xml "$@" &
integration_run=$!
image=5
if [ -n "$build" ]; then
    BERT_SERVE_TEST_IMAGE_STATUS=0
    wait "$build" || BERT_SERVE_TEST_IMAGE_STATUS=$?
    export BERT_SERVE_TEST_IMAGE_STATUS
    "${pytest[@]}" -m image -p no:randomly --junitxml=build/test-times-image.xml \
        >build/test-image.log 2>&1
    image=$?
fi
wait "$integration_run"
integration=$? integration_run=""
[ -z "$build" ] || cat build/test-image.log
selected="integration and alone"
[ -n "$build" ] || selected="integration and (alone or image)"
"${pytest[@]}" -m "$selected" -p no:randomly --junitxml=build/test-times-alone.xml "$@"
alone=$?
for status in "$unit" "$integration" "$image" "$alone"; do
    # 5: no test selected (arguments that name only one layer's tests)
    [ "$status" -eq 0 ] || [ "$status" -eq 5 ] || exit "$status"
done
if [ "$unit$integration$image$alone" = 5555 ]; then
    echo "no test selected" >&2
    exit 5
fi
