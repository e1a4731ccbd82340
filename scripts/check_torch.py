"""Check that an environment, or a wheelhouse, holds the torch build asked for: the CPU build
and no CUDA library (no nvidia-*, cuda-*, triton), or a CUDA build. ``make install`` runs it
on the venv it made (scripts/install.sh), ``make image`` on the image's wheels (scripts/image.sh).

    python scripts/check_torch.py cpu                 # this Python's environment
    python scripts/check_torch.py cpu --wheels DIR    # a folder of wheels
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

from bert_serve_server.environment import BUILDS, build_problems, wheel_distributions


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("build", choices=BUILDS)
    parser.add_argument("--wheels", type=Path, help="check these wheels, not this environment")
    args = parser.parse_args()
    if args.wheels is not None:
        names = wheel_distributions(args.wheels)
        torch_version, torch_cuda = names.get("torch", "absent"), None
        where = str(args.wheels)
    else:
        import torch

        names = {dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions()}
        torch_version, torch_cuda = torch.__version__, torch.version.cuda
        where = sys.prefix
    problems = build_problems(args.build, torch_version, torch_cuda, names)
    for problem in problems:
        print(f"check_torch: {where}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{where}: torch {torch_version}, the {args.build} build as asked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
