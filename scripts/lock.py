"""Write requirements/server.lock from a fresh resolution and print what changed
(``make lock`` runs scripts/lock.sh, which resolves and then calls this).

    python scripts/lock.py REPORT [--lock requirements/server.lock]

REPORT is the JSON of ``pip install --dry-run --report`` for ``.[server,dev]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bert_serve_server.environment import (
    LOCK,
    lock_changes,
    lock_text,
    parse_lock,
    pins_from_report,
)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("report", type=Path)
    parser.add_argument("--lock", type=Path, default=LOCK)
    args = parser.parse_args()
    pins = pins_from_report(json.loads(args.report.read_text()))
    python = ".".join(str(part) for part in sys.version_info[:2])
    try:
        text = lock_text(pins, python)
    except ValueError as error:
        print(f"lock: {error}", file=sys.stderr)
        return 1
    old = parse_lock(args.lock.read_text()) if args.lock.is_file() else {}
    args.lock.parent.mkdir(parents=True, exist_ok=True)
    args.lock.write_text(text)
    changes = lock_changes(old, pins)
    print("\n".join(changes) if changes else "no change")
    print(f"{args.lock}: {len(pins)} distributions, {len(changes)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
