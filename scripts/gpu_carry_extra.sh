#!/usr/bin/env bash
# Add LitServe to .gpu-carry/ (built by ../shared/gpu/make-carry.sh) for the GPU report's peer:
# LitServe and what it imports (FastAPI, Starlette, pydantic, uvicorn, pyzmq, ...) as Python 3.12
# x86-64 wheels at the versions of requirements/server.lock, unpacked and packed with xz into
# .gpu-carry/litserve-site.tar.xz (about 3 MiB; as wheels they are 4.4 MiB, more than one call's
# 64 MiB leaves beside the kit and the tree). uvicorn's optional speedups (uvloop, httptools) are
# left out for the same reason: LitServe there parses HTTP with h11 on asyncio's loop, and the
# report records which it ran with. On the GPU host, scripts/gpu_device_extra.sh unpacks it.
# Run from the project root after make-carry.sh:
#   bash ../shared/gpu/make-carry.sh && bash scripts/gpu_carry_extra.sh
set -euo pipefail
out=.gpu-carry
[ -d "$out/whl" ] || { echo "no $out/whl: run bash ../shared/gpu/make-carry.sh first"; exit 1; }
names="litserve fastapi starlette pydantic pydantic-core annotated-types annotated-doc typing-inspection typing-extensions anyio idna uvicorn h11 click pyzmq opentelemetry-api"
pins=()
for name in $names; do
    pins+=("$(grep -iE "^${name}==" requirements/server.lock)")
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp/whl" "${pins[@]}"
mkdir "$tmp/site"
for wheel in "$tmp"/whl/*.whl; do
    python3 -m zipfile -e "$wheel" "$tmp/site"
done
tar -C "$tmp/site" -cf - . | xz -9e -T2 > "$out/litserve-site.tar.xz"
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carry_bytes=$(du -sb "$out" | cut -f1)
echo "$out: $((carry_bytes / 1048576)) MiB with LitServe; with the tracked tree $(((carry_bytes + tree_bytes) / 1048576)) MiB; limit per call 64 MiB"
[ $((carry_bytes + tree_bytes)) -lt $((64 * 1048576)) ] || { echo "too large for one call"; exit 1; }
