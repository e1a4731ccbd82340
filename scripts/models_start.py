"""Start an image of several models as the pod runs it and time its startup probe
(``make models-start``; ``lab.models_start`` says how). Writes the record as JSON.

    python scripts/models_start.py --image bert-serve-models:test --models 3 --out F
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.image import ImageTestFailed, engine_command
from lab.models_start import models_start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--models", type=int, required=True, help="how many the image serves")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    def say(line: str) -> None:
        print(f"models-start: {line}", flush=True)

    try:
        result = models_start(engine_command(), args.image, args.models, say)
    except ImageTestFailed as failure:
        print(f"models-start: FAILED\n{failure}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    say(f"passed; record in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
