#!/usr/bin/env bash
# Add to .gpu-carry/ (built by ../shared/gpu/make-carry.sh) what the GPU report needs beyond
# TorchServe: LitServe and what it installs (FastAPI, Starlette, pydantic, uvicorn with its
# standard extras, pyzmq, ...) as Python 3.12 wheels for x86-64 Linux, at the versions of
# requirements/server.lock, into .gpu-carry/whl/, which device-setup.sh installs with the rest.
# Run from the project root after make-carry.sh:
#   bash ../shared/gpu/make-carry.sh && bash scripts/gpu_carry_extra.sh
# The GPU image may hold some of them already; they are carried all the same (the host has no
# package index) and, installed first on PYTHONPATH, win there.
set -euo pipefail
out=.gpu-carry
[ -d "$out/whl" ] || { echo "no $out/whl: run bash ../shared/gpu/make-carry.sh first"; exit 1; }
names="litserve fastapi starlette pydantic pydantic-core annotated-types annotated-doc typing-inspection typing-extensions anyio idna sniffio uvicorn h11 click httptools uvloop python-dotenv websockets watchfiles pyzmq opentelemetry-api importlib-metadata zipp"
pins=()
for name in $names; do
    pin=$(grep -iE "^${name}==" requirements/server.lock || true)
    [ -n "$pin" ] && pins+=("$pin")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$out/whl" "${pins[@]}"
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carry_bytes=$(du -sb "$out" | cut -f1)
echo "$out: $((carry_bytes / 1048576)) MiB with LitServe; tracked tree $((tree_bytes / 1048576)) MiB; limit per call 64 MiB"
[ $((carry_bytes + tree_bytes)) -lt $((63 * 1048576)) ] || { echo "too large for one call"; exit 1; }
