# Sourced by scripts/install.sh, scripts/lock.sh and scripts/image.sh: which torch build, and
# the index it comes from (server/bert_serve_server/environment.py says why the lock pins the CPU build).
#   TORCH        cpu (the default) or cuda
#   TORCH_INDEX  an index pip adds (--extra-index-url) for torch. Unset: PyTorch's CPU index,
#                https://download.pytorch.org/whl/cpu, for cpu; none for cuda (PyPI's Linux
#                torch is the CUDA build; https://download.pytorch.org/whl/cu126 and the like
#                give another CUDA version). Empty: none, pip's own configuration only.
#                An index that does not answer within 10 s is left out with a note: the
#                lock's torch==X+cpu must then come from pip's own configuration (a local
#                wheel), or the install fails; it never becomes the CUDA build.
# Sets torch_build and torch_index_args (an array for pip), after TORCH_BUILD_DEFAULT if set.
torch_build="${TORCH:-${TORCH_BUILD_DEFAULT:-cpu}}"
case "$torch_build" in
    cpu) default_index=https://download.pytorch.org/whl/cpu ;;
    cuda) default_index= ;;
    *) echo "TORCH=$torch_build: expected cpu or cuda" >&2; exit 2 ;;
esac
torch_index="${TORCH_INDEX-$default_index}"
torch_index_args=()
if [ -n "$torch_index" ]; then
    if command -v curl >/dev/null && ! curl -fsS --max-time 10 -o /dev/null "${torch_index%/}/torch/" 2>/dev/null; then
        echo "note: $torch_index does not answer: left out; pip's own configuration must provide torch (TORCH_INDEX= to say so)" >&2
    else
        torch_index_args=(--extra-index-url "$torch_index")
    fi
fi

# torch_constraints PYTHON FILE: write requirements/server.lock as constraints for this build
# (bert_serve_server.environment.with_torch_build), with any Python of 3.9 or later.
torch_constraints() {
    PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/server" "$1" -c 'import sys
from bert_serve_server.environment import LOCK, with_torch_build
sys.stdout.write(with_torch_build(LOCK.read_text(), sys.argv[1]))' "$torch_build" >"$2"
}
