"""Fuzz the API from docs/openapi.yaml with schemathesis against a real torchserve (``make fuzz``).

``lab.fuzz`` holds the run; this starts its own server on free local ports
(always stopped), runs it, prints the summary and writes it as ``fuzz.json`` into --out.

    python scripts/fuzz.py --max-examples 30 --max-time 45              # about what make test runs
    python scripts/fuzz.py --max-examples 500 --max-time 300 --out docs/fuzz   # make fuzz

``--max-examples`` bounds each operation's cases per round; ``--max-time`` bounds the run
(schemathesis keeps fuzzing until it is spent). Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bert_serve_server.control import running

from lab.fuzz import passed, run_fuzz


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--max-examples", type=int, default=30, help="cases per operation per round"
    )
    parser.add_argument("--max-time", type=int, default=45, help="seconds for the whole run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="folder for fuzz.json (the summary)")
    args = parser.parse_args()
    with running(prefix="bert-serve-fuzz-") as server:
        summary = run_fuzz(
            server, max_examples=args.max_examples, max_time=args.max_time, seed=args.seed
        )
    tail = summary.pop("output_tail")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fuzz.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    if tail:
        print(tail, file=sys.stderr)
    return 0 if passed(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
