#!/usr/bin/env bash
# Build the bert-serve image (deploy/Dockerfile) with podman or docker, then print its size
# and what makes it up. The context is build/image/context: the layout of
# python -m bert_serve_server layout, the entrypoint, and a wheelhouse from `pip download` with the
# server package's wheel (server/).
#   IMAGE       the tag (default bert-serve:0.1.0)
#   PROXY_IMAGE the proxy's tag (default bert-serve-proxy:0.1.0): deploy/proxy/, Debian's nginx
#               on the same base, built after the server's image
#   BASE_IMAGE  default debian:bookworm-slim; when it is neither present nor pullable (no
#               registry), a debootstrap'd bookworm minbase (scripts/image_base.sh) is used
#   DEBIAN_MIRROR the Debian archive probed first, and the one a debootstrap'd base is made
#               from (default http://deb.debian.org/debian)
#   TORCH       cpu (default) or cuda: the torch build of the image's wheels, checked before
#               the build (scripts/check_torch.py: no CUDA library in a CPU image)
#   TORCH_INDEX where that torch comes from (scripts/torch_build.sh: PyTorch's CPU index for
#               cpu, PyPI's CUDA build for cuda unless set)
set -euo pipefail
cd "$(dirname "$0")/.."
image="${IMAGE:-bert-serve:0.1.0}"
base="${BASE_IMAGE:-debian:bookworm-slim}"
python="${VENV_PYTHON:-.venv/bin/python}"  # not PYTHON: make install reads that as the venv's base
engine_line="$(bash scripts/container_engine.sh)"
read -ra engine <<<"$engine_line"

# The stages that fetch from a package archive (Debian's, PyPI or pip's configured index) fail
# with this line when they cannot: the network's failure, not the project's, which the image
# test reports as a skip (tests/integration/test_image.py).
archive_unreachable() {
    echo "image: a package archive could not be reached ($1); no image built" >&2
    exit 75
}
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if command -v curl >/dev/null; then
    curl -fsS --max-time 30 -o /dev/null "$mirror/dists/bookworm/Release" \
        || archive_unreachable "$mirror"
fi

if ! "${engine[@]}" image inspect "$base" >/dev/null 2>&1 \
    && ! timeout 120 "${engine[@]}" pull "$base" >/dev/null 2>&1; then
    echo "$base cannot be pulled here: using a debootstrap'd bookworm minbase"
    base=localhost/bookworm-minbase:12
    "${engine[@]}" image inspect "$base" >/dev/null 2>&1 \
        || DEBIAN_MIRROR="$mirror" bash scripts/image_base.sh "${engine[@]}" "$base" \
        || { [ $? = 75 ] && archive_unreachable "debootstrap from $mirror"; exit 1; }
fi

source scripts/torch_build.sh
context=build/image/context
wheels="build/image/wheels-$torch_build"
"$python" -m bert_serve_server layout --out "$context" ${MODELS:+--models "$MODELS"} >/dev/null
cp deploy/entrypoint.sh "$context/entrypoint.sh"
# The runtime packages at the locked versions (requirements/server.lock, the tested ones),
# torch as the build asked for.
torch_constraints "$python" build/image/constraints.txt
"$python" -m pip download -qq --dest "$wheels" "${torch_index_args[@]}" \
    -r "$context/requirements.txt" -c build/image/constraints.txt \
    || archive_unreachable "pip download"
# Only the wheels this requirements.txt resolves to go into the context.
"$python" -m pip download -qq --no-index --find-links "$wheels" --dest "$context/wheels" \
    -r "$context/requirements.txt" -c build/image/constraints.txt
"$python" scripts/check_torch.py "$torch_build" --wheels "$context/wheels"
# The server package users run (server/), as a wheel: the image installs it and nothing else of
# the checkout; its dependencies are among requirements.txt's.
rm -rf "$context"/wheels/bert_serve_server-*.whl server/build  # no stale module from an old build
"$python" -m pip wheel -qq --no-deps --no-build-isolation --wheel-dir "$context/wheels" ./server

format=()
[ "${engine[0]}" = podman ] && format=(--format docker)  # OCI images drop HEALTHCHECK
# The wheels are mounted, not copied, so the engine's layer cache cannot see them change: a
# hash of their names and of the server package's source (a rebuilt wheel's bytes differ by
# their timestamps), a build argument the install step names, makes a change reinstall.
wheels_sha=$( (ls "$context/wheels"; cat server/pyproject.toml \
    $(find server/bert_serve_server -name '*.py' | LC_ALL=C sort)) | sha256sum | cut -d' ' -f1)
"${engine[@]}" build "${format[@]}" --network host --build-arg "BASE_IMAGE=$base" \
    --build-arg "WHEELS_SHA256=$wheels_sha" -f deploy/Dockerfile -t "$image" "$context"

proxy_image="${PROXY_IMAGE:-bert-serve-proxy:0.1.0}"
"${engine[@]}" build "${format[@]}" --network host --build-arg "BASE_IMAGE=$base" \
    -f deploy/proxy/Dockerfile -t "$proxy_image" deploy/proxy \
    || { echo "image: the proxy's image $proxy_image was not built" >&2; exit 1; }
echo "== $proxy_image: $("${engine[@]}" image inspect --format '{{.Size}}' "$proxy_image" | numfmt --to=si)B"

echo "== $image: $("${engine[@]}" image inspect --format '{{.Size}}' "$image" | numfmt --to=si)B, on $base"
"${engine[@]}" history --format '{{.Size}}\t{{.CreatedBy}}' "$image" | cut -c1-150
echo "== largest parts (MB)"
"${engine[@]}" run --rm --no-healthcheck --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --entrypoint sh "$image" -c \
    'du -sm /opt/bert-serve/lib/python3.11/site-packages/* /usr/lib/jvm /usr/lib/python3.11 /usr/lib/x86_64-linux-gnu /mnt/models 2>/dev/null | sort -rn | head -12'
