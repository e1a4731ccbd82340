#!/bin/sh
# The image's entrypoint: TorchServe in the foreground, arguments as for `torchserve`.
# SIGTERM is trapped before anything else runs. During the sizing step the trap stops that step
# and the container exits at once; once TorchServe runs, it drains the queue, then runs
# `torchserve --stop --foreground`: SIGTERM to the Java frontend, which stops its workers, and
# a wait of up to 60 s for it to exit. (As PID 1, TorchServe's Python launcher would ignore SIGTERM: it has no
# handler.) A shell runs a trap only once its foreground command ends, so each step runs in
# the background and the shell waits for it.
# Workers, the queue bound and the heap follow this container's CPU and memory limits:
# the installed server package (python -m bert_serve_server size) writes the config with them
# filled in to the home folder and prints the torch threads per worker; TorchServe takes the
# last --ts-config.
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
threads=$(cat "$HOME/threads")
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
# Before the stop, what TorchServe accepted is answered (python -m bert_serve_server ready
# --drain: not ready from then on, and a wait until the queues are empty, at most 75 s of the
# pod's 90 s grace period); `torchserve --stop` alone drops it.
rm -f "$HOME/draining"
trap 'python3.11 -m bert_serve_server ready --drain; torchserve --stop --foreground' TERM INT
[ -n "$stopping" ] && exit 0
torchserve --foreground --ncs "$@" --ts-config "$sized" &
launcher=$!
wait "$launcher"
status=$?
if [ "$status" -gt 128 ]; then
    wait "$launcher"
    status=$?
fi
exit "$status"
