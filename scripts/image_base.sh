#!/usr/bin/env bash
# Make the base image from Debian's archive when no image registry can be reached:
# a minbase debootstrap of bookworm (what debian:bookworm-slim is made from), imported
# as one layer. Usage: image_base.sh ENGINE... NAME   e.g. image_base.sh podman localhost/bookworm-minbase:12
set -euo pipefail
name="${*: -1}"
engine=("${@:1:$#-1}")
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d "${TMPDIR:-/tmp}/bookworm-rootfs.XXXXXX")"
# --one-file-system: a debootstrap cut short can leave the host's proc, sys or dev mounted
# inside the rootfs; removing it must never reach through them.
trap 'rm -rf --one-file-system "$root"' EXIT
# Exit 75 when debootstrap fails: the archive could not be reached (scripts/image.sh).
timeout 900 debootstrap --variant=minbase bookworm "$root" "$mirror" || exit 75
# As debian:bookworm-slim: no apt lists, caches, docs or man pages kept in the layer.
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/*
tar -C "$root" --numeric-owner -c . | "${engine[@]}" import \
    --change 'CMD ["bash"]' --message "debootstrap --variant=minbase bookworm $mirror" - "$name"
