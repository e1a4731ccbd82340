"""``python -m lab NAME [args]``: the lab's tools, one command each (``python -m lab NAME -h``
says what it runs and writes; ``python -m lab`` lists them)."""

from __future__ import annotations

import importlib
import sys

TOOLS = {
    "bench": "lab.bench",
    "chaos": "lab.chaos",
    "check-defaults": "lab.defaults_check",
    "compare-precision": "lab.compare",
    "fuzz": "lab.fuzz",
    "gpu-report": "lab.gpu_report",
    "image-test": "lab.image",
    "models-start": "lab.image",
    "pod-test": "lab.pod",
    "soak": "lab.soak",
}
"""Each tool's module, whose ``main(argv)`` parses its own arguments."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in TOOLS:
        print(__doc__.split("\n\n")[0] + "\n\n  " + "\n  ".join(TOOLS), file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    tool: int = importlib.import_module(TOOLS[args[0]]).main(args[1:])
    return tool


if __name__ == "__main__":
    sys.exit(main())
