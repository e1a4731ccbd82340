"""What explanations cost predictions: prediction p50 at 8 closed-loop clients, alone and with
one client asking /explanations beside them, on a TorchServe of the default config (free
127.0.0.1 ports, always stopped). Rounds alternate; each is bounded in time
(``lab.explain_cost``).

    python scripts/explain_cost.py --out /tmp/explain_cost.json            # about 2 minutes
    python scripts/explain_cost.py --n-steps 10 --out /tmp/explain10.json  # cheaper explanations

Prints the summary and whether the predictions' p50 beside explanations stays within 1.5x.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bert_serve_server.control import running

from lab import explain_cost
from lab.corpus import make_corpus
from lab.machine import describe

BAR = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15, help="per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--n-steps", type=int, help="steps each explanation asks (default: the server's)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config.properties override"
    )
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    texts = make_corpus(size=200, max_words=60)
    with running(overrides) as server:
        result = explain_cost.measure(
            server.predict_url,
            server.headers(),
            texts,
            concurrency=args.concurrency,
            seconds=args.seconds,
            rounds=args.rounds,
            n_steps=args.n_steps,
        )
        result["in_force"] = server.sizing()["in_force"]
    result["machine"] = describe()
    result["bar_met"] = result["p50_ratio"] <= BAR
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("machine", "in_force")}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
