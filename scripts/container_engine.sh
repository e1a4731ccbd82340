#!/usr/bin/env bash
# Print the container engine command that works here, or say why none does (exit 1).
# podman runs with Debian's runc and cgroupfs where runc is installed: the default crun
# refuses this project's machines (their cgroup layout and limits). docker only with an engine.
set -euo pipefail
if command -v podman >/dev/null; then
    engine=(podman)
    [ -x /usr/bin/runc ] && engine+=(--runtime /usr/bin/runc --cgroup-manager cgroupfs)
    if "${engine[@]}" info >/dev/null 2>&1; then
        echo "${engine[*]}"
        exit 0
    fi
    echo "podman is installed but \`${engine[*]} info\` fails" >&2
elif command -v docker >/dev/null; then
    if docker info >/dev/null 2>&1; then
        echo docker
        exit 0
    fi
    echo "docker is installed but has no engine (\`docker info\` fails), and podman is not installed" >&2
else
    echo "neither podman nor docker is installed" >&2
fi
exit 1
