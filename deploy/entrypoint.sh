#!/bin/sh
# The image's entrypoint: TorchServe in the foreground, arguments as for `torchserve`.
# SIGTERM is trapped before anything else runs. During the sizing step the trap stops that step
# and the container exits at once; once TorchServe runs, it drains (every accepted request
# answered), then runs `python3.11 -m bert_serve_server stop`: SIGTERM to the Java frontend,
# which stops its workers, and SIGKILL to the frontend and its workers past the stop budget. (As PID 1, TorchServe's Python launcher would ignore
# SIGTERM: it has no handler.) A shell runs a trap only once its foreground command ends, so
# each step runs in the background and the shell waits for it. The container exits non-zero
# when the frontend ends without that stop.
# Workers, the queue bound and the heap follow this container's CPU and memory limits:
# the installed server package (python -m bert_serve_server size) writes the config with them
# filled in to the home folder and prints the torch threads per worker, then the precision it
# chose for each model configured `auto` (BERT_SERVE_PRECISION_CHOSEN, which the workers read);
# TorchServe takes the last --ts-config.
# The home folder holds all the server writes (the root may be read-only): the sized config,
# TorchServe's pid file and unpacked archives (TMPDIR, TEMP) and its logs (logs/); it is the
# state folder `python3.11 -m bert_serve_server status` reads (BERT_SERVE_STATE_DIR).
# What the sizing step measures of each archive (its rates by batch size, a worker's memory) is
# kept there too (BERT_SERVE_MEASURE_CACHE, by the archive's sha256 and the measurement's
# arguments): a container restarted in its pod (the home an emptyDir, which outlives it) starts
# on the same plan without measuring again.
export TMPDIR="$HOME/tmp" TEMP="$HOME/tmp"
export BERT_SERVE_MEASURE_CACHE="${BERT_SERVE_MEASURE_CACHE:-$HOME/measured}"
mkdir -p "$TMPDIR" || exit 1
step=""
stopping=""
trap 'stopping=1; [ -n "$step" ] && kill -TERM "$step" 2>/dev/null' TERM INT
sized="$HOME/config.properties"
python3.11 -m bert_serve_server size --out "$sized" -- "$@" >"$HOME/threads" &
step=$!
wait "$step"
status=$?
# A trapped signal ends that wait early (status > 128); this one waits for the step itself.
if [ "$status" -gt 128 ]; then
    wait "$step"
    status=$?
fi
[ -n "$stopping" ] && exit 0
[ "$status" -eq 0 ] || exit 1
threads=$(sed -n 1p "$HOME/threads")
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
# the tokenizer's Rust pool (one thread per CPU by default) gets the same share
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-$threads}"
BERT_SERVE_PRECISION_CHOSEN=$(sed -n 2p "$HOME/threads")
export BERT_SERVE_PRECISION_CHOSEN
# Before the stop, what TorchServe accepted is answered (python -m bert_serve_server ready
# --drain: not ready from then on; a wait while the proxy beside it still listens on
# BERT_SERVE_DRAIN_WAIT_PORT, if set, as it keeps accepting for its stop delay; then until every
# accepted request is answered, at most 70 s); a stop alone drops it. The frontend then gets
# BERT_SERVE_STOP_S (15 s: 3 times the 4.6 s make image-test measured) to exit before it and
# its workers are killed; the pod's grace period (90 s) covers both and the exec's start
# (deploy/README.md).
rm -f "$HOME/draining"
stop_s="${BERT_SERVE_STOP_S:-15}"
trap 'stopping=1; python3.11 -m bert_serve_server ready --drain ${BERT_SERVE_DRAIN_WAIT_PORT:+--wait-port "$BERT_SERVE_DRAIN_WAIT_PORT"}; python3.11 -m bert_serve_server stop --timeout "$stop_s"' TERM INT
[ -n "$stopping" ] && exit 0
torchserve --foreground --ncs "$@" --ts-config "$sized" &
launcher=$!
wait "$launcher"
status=$?
if [ "$status" -gt 128 ]; then
    wait "$launcher"
    status=$?
fi
# TorchServe's launcher exits 0 whatever ended the Java frontend (ts/model_server.py ignores
# its status): a frontend that ends without this stop (a JVM that died, a port already taken,
# an OutOfMemoryError) is a failure, and the container says so.
if [ -z "$stopping" ]; then
    echo "bert-serve: TorchServe's frontend exited without a stop being asked (launcher status $status): exiting 1" >&2
    exit 1
fi
exit "$status"
