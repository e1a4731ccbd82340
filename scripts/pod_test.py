"""Run the whole Deployment as one pod with ``podman kube play`` and check its bars
(``make pod-test``; ``lab.pod`` has the steps): the images ``make image`` built, the proxy with
the key, 256 patient clients, a killed frontend, SIGTERM while clients open new connections
(one worker, then two forced). Writes the figures, with the hash of what they measured, to
build/image/pod-test.json (deploy/pod-test.json is the committed record).

    python scripts/pod_test.py [--image bert-serve:0.1.0] [--proxy-image bert-serve-proxy:0.1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bert_serve_server.config import ROOT

from lab.image import engine_command
from lab.pod import PodTestFailed, measured_from, run_pod_test

BASES = ("localhost/bookworm-minbase:12", "debian:bookworm-slim")
"""The bases scripts/image.sh builds on: its debootstrap'd minbase where no registry answers."""


def built_base(engine: list[str]) -> str:
    for base in BASES:
        if subprocess.run([*engine, "image", "exists", base], capture_output=True).returncode == 0:
            return base
    return BASES[-1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", default=os.environ.get("IMAGE", "bert-serve:0.1.0"))
    parser.add_argument(
        "--proxy-image", default=os.environ.get("PROXY_IMAGE", "bert-serve-proxy:0.1.0")
    )
    parser.add_argument(
        "--base",
        default=os.environ.get("POD_BASE"),
        help="the pause image's base where podman has no catatonit (default: the base "
        "scripts/image.sh built on, its debootstrap'd minbase or debian:bookworm-slim)",
    )
    parser.add_argument("--tag", default=f"t{os.getpid()}")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "image" / "pod-test.json")
    args = parser.parse_args()
    images = {"torchserve": args.image, "proxy": args.proxy_image}
    try:
        result = run_pod_test(
            engine_command(),
            images,
            args.tag,
            ROOT / "build" / "pod" / args.tag,
            say=lambda line: print(f"pod-test: {line}", flush=True),
            base=args.base or built_base(engine_command()),
        )
    except PodTestFailed as failure:
        print(f"pod-test: FAILED\n{failure}", file=sys.stderr)
        return 1
    result["measured_from"] = measured_from()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"pod-test: passed; figures in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
