#!/bin/sh
# The image's entrypoint: TorchServe in the foreground, arguments as for `torchserve`.
# As PID 1 its Python launcher would ignore SIGTERM (it has no handler), so this shell traps
# it and runs `torchserve --stop --foreground`: SIGTERM to the Java frontend, which stops
# its workers, and a wait of up to 60 s for it to exit.
trap 'torchserve --stop --foreground' TERM INT
torchserve --foreground --ncs "$@" &
launcher=$!
wait "$launcher"
status=$?
# A trapped signal ends that wait early (status > 128); this one waits for the launcher.
if [ "$status" -gt 128 ]; then
    wait "$launcher"
    status=$?
fi
exit "$status"
