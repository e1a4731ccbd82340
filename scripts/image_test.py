"""Run the bert-serve image and check it as a user would (``make image-test``).

Starts the container with its ports published on free 127.0.0.1 ports, waits for READY
(/ping healthy and every worker READY), runs the request checks (the README's examples, a
list, a pair, an Open Inference (v2) request, /metrics: ``lab.image_checks.CHECKS``),
runs the image's health check, measures each process's memory from the host after a short
bounded burst, then sends SIGTERM and checks the container exits 0 within the grace period.
The container is always removed (``lab.image`` has the steps). Writes the numbers to
build/image/image-test.json.

    python scripts/image_test.py [--image bert-serve:0.1.0] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bert_serve_server.config import ROOT

from lab.image import ImageTestFailed, engine_command, run_image_test


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", default=os.environ.get("IMAGE", "bert-serve:0.1.0"))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "image" / "image-test.json")
    args = parser.parse_args()
    try:
        result = run_image_test(
            args.image, engine_command(), say=lambda line: print(f"image-test: {line}", flush=True)
        )
    except ImageTestFailed as failure:
        print(f"image-test: FAILED\n{failure}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"image-test: passed; numbers in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
