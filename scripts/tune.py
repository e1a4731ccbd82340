"""Tuner: the batching config that is close to the best at every load, not at one guessed load.

Every candidate (batch size, maxBatchDelay, workers x torch threads) runs on its own
TorchServe (free 127.0.0.1 ports, stopped afterwards); all run at once, idle but one, and at
each concurrency of --loads each gets the benchmark's corpus in turn, one closed loop per
level, so a slow spell of the machine does not favour whichever config ran at a quiet time. For each level the best requests/s of any
candidate is the reference; a candidate's score is its worst ratio to that reference over
all levels, and the recommendation is the candidate with the best score. A second, smaller
experiment measures what TorchServe's logging costs: the default config at --log-clients
clients with TorchServe's built-in log4j2 config and with config/log4j2.xml, alternated.

The experiments live in ``lab.tune``. Writes ``results.json``, ``tune.png`` and
``recommended.properties`` into --out.

    python scripts/tune.py --out docs/tune                       # make tune
    python scripts/tune.py --candidates b1d0w2t1 b16d2w2t1 --loads 1 32 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bert_serve_server.config import ROOT
from bert_serve_server.sizing import read_machine

from lab import tune
from lab.corpus import make_corpus
from lab.measure import Loads
from lab.reports import plot_tune, tune_snippet


def candidate(name: str) -> dict[str, int]:
    try:
        return tune.parse_candidate(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "tune")
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--seconds", type=float, default=5, help="measured seconds per load")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument(
        "--candidates",
        type=candidate,
        nargs="+",
        default=[
            tune.parse_candidate(name) for name in tune.default_candidates(read_machine(0).cores)
        ],
    )
    parser.add_argument("--log-clients", type=int, default=32)
    parser.add_argument("--log-rounds", type=int, default=2, help="0 skips the logging experiment")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    loads = Loads(args.loads, args.seconds, args.warmup)
    results: dict[str, Any] = {
        "command": " ".join(["python scripts/tune.py", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    results |= tune.run(args.candidates, make_corpus(), loads, args.log_clients, args.log_rounds)
    runs, best = results["runs"], results["recommended"]
    snippet = tune_snippet(best, args.loads)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "recommended.properties").write_text(snippet)
    plot_tune(runs, best, args.out)
    print(snippet)
    if "logging" in results:
        print(json.dumps(results["logging"]["mean"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
