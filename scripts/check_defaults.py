"""Check the shipped defaults on the default model and on stand-ins for faster and slower
hardware (``lab.defaults_check``): patient clients never refused, clients that state a
deadline better off than those that do not. Writes ``defaults.json`` into ``--out`` and prints
each model's sizing and bars; exits 1 if a bar is not met.

    python scripts/check_defaults.py --out docs/bench            # make check-defaults
    python scripts/check_defaults.py --models fast --seconds 5 --out /tmp/defaults
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bert_serve_server.config import ROOT

from lab import defaults_check
from lab.machine import describe


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument(
        "--models", nargs="+", choices=defaults_check.MODELS, default=list(defaults_check.MODELS)
    )
    parser.add_argument("--seconds", type=float, default=15, help="seconds per level")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = defaults_check.run(tuple(args.models), args.seconds)
    report = {
        "command": "make check-defaults",
        "started": started,
        "machine": describe(),
        "seconds_per_level": args.seconds,
        "models": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "defaults.json").write_text(json.dumps(report, indent=2) + "\n")
    failed = 0
    for model, result in results.items():
        (entry,) = [e for v in result["sizing"]["models"].values() for e in v.values()]
        print(
            f"{model}: {entry['minWorkers']} workers x {result['sizing']['torch_threads']} "
            f"thread(s), batchSize {entry['batchSize']}, "
            f"job_queue_size {result['sizing']['job_queue_size']}; "
            f"capacity {result['levels']['capacity']['goodput_per_s']}/s"
        )
        for name, bar in result["bars"].items():
            failed += not bar["met"]
            verdict = "met" if bar["met"] else "NOT MET"
            print(f"  {name}: {bar['value']} (needed {bar['needed']}): {verdict}")
    print(f"wrote {args.out / 'defaults.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
