"""Two builds of the .mar, two environments or two TorchServe settings, loaded in turn at each
level: did a change move the served numbers? Ratios are AFTER over BEFORE, measured in one run
on one machine.

    git worktree add --detach ../before <commit>
    (cd ../before && PYTHONPATH=.:server ../main/.venv/bin/python -m bert_serve_server package \
        --model-dir ../main/build/bert-sentiment --export-path /tmp/before)
    python scripts/compare_mars.py --before /tmp/before --after model_store --out build/ab.json

An environment setting (one .mar, two servers), e.g. OpenMP's waiting threads:

    python scripts/compare_mars.py --before model_store --after model_store \
        --after-env OMP_WAIT_POLICY=PASSIVE --out build/omp-ab.json

A TorchServe setting (config.properties keys over config/config.properties), e.g. its Netty
threads:

    python scripts/compare_mars.py --before model_store --after model_store \
        --after-set number_of_netty_threads=1 netty_client_threads=1 --out build/netty-ab.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.corpus import make_corpus
from lab.measure import Loads, compare_stores, env_assignments


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="a model store with bert.mar")
    parser.add_argument("--after", type=Path, required=True, help="a model store with bert.mar")
    parser.add_argument("--before-env", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--after-env", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--before-set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--after-set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--out", type=Path, default=Path("build/compare-mars.json"))
    args = parser.parse_args()
    loads = Loads(args.loads, args.seconds, warmup=3)
    stores = {"before": args.before, "after": args.after}
    envs = {"before": env_assignments(args.before_env), "after": env_assignments(args.after_env)}
    sets = {"before": env_assignments(args.before_set), "after": env_assignments(args.after_set)}
    results = compare_stores(stores, make_corpus(), loads, envs, sets)
    ratios = {
        level: round(results["after"][level]["rps"] / results["before"][level]["rps"], 3)
        for level in results["before"]
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"rps_after_over_before": ratios, "envs": envs, "sets": sets, "results": results}
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
