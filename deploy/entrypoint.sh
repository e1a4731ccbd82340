#!/bin/sh
# The image's entrypoint: TorchServe in the foreground, arguments as for `torchserve`.
# As PID 1 its Python launcher would ignore SIGTERM (it has no handler), so this shell traps
# it and runs `torchserve --stop --foreground`: SIGTERM to the Java frontend, which stops
# its workers, and a wait of up to 60 s for it to exit.
# Workers, the queue bound and the heap follow this container's CPU and memory limits:
# the installed server package (python -m bert_serve_server size) writes the config with them
# filled in to the home folder and prints the torch threads per worker; TorchServe takes the
# last --ts-config.
sized="$HOME/config.properties"
threads=$(python3.11 -m bert_serve_server size --out "$sized" -- "$@") || exit 1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
trap 'torchserve --stop --foreground' TERM INT
torchserve --foreground --ncs "$@" --ts-config "$sized" &
launcher=$!
wait "$launcher"
status=$?
# A trapped signal ends that wait early (status > 128); this one waits for the launcher.
if [ "$status" -gt 128 ]; then
    wait "$launcher"
    status=$?
fi
exit "$status"
