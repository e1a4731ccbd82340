"""Write the container / KServe layout of the model from config/config.properties
(``harness.layout`` says what it rewrites and why).

    python scripts/deploy_layout.py [--out build/kserve]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.layout import DEFAULT_OUT, write_layout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    out = write_layout(args.out.resolve())
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        print(path.relative_to(out))
    print(f"layout written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
