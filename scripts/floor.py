"""The floor: TorchServe and LitServe each serving a constant, a free forward and the real
model at 1 and 8 clients, and a lone request on our server taken apart (``lab.floor``).

    python scripts/floor.py --out docs/bench          # about 5 minutes -> floor.json
    python scripts/floor.py --smoke --out /tmp/floor  # TorchServe only, a few seconds a level

Prints the issue's one-client bars: our real server's requests/s against LitServe's, and its
p50 against TorchServe's floor + the in-process lone forward + 1 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bert_serve_server.archive import DEFAULT_MODEL_DIR
from bert_serve_server.config import ROOT

from lab import floor
from lab.corpus import make_corpus
from lab.machine import describe
from lab.measure import Loads


def one_client_bars(results: dict[str, Any]) -> dict[str, Any]:
    one = {kind: levels["1"] for kind, levels in results["by_kind"].items()}
    ours, constant = one["torchserve_real"], one["torchserve_constant"]
    allowed = constant["p50_ms"] + results["in_process_lone"]["batch_ms_p50"] + 1
    bars: dict[str, Any] = {
        "p50_ms": ours["p50_ms"],
        "p50_allowed_ms": round(allowed, 1),
        "p50_met": ours["p50_ms"] <= allowed,
    }
    if "litserve_real" in one:
        ratio = ours["rps"] / max(one["litserve_real"]["rps"], 1e-9)
        bars |= {"rps_vs_litserve": round(ratio, 3), "rps_met": ratio >= 1.0}
    return bars


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--seconds", type=float, default=8, help="measured time per level")
    parser.add_argument("--lone-requests", type=int, default=300)
    parser.add_argument("--smoke", action="store_true", help="TorchServe only, short levels")
    args = parser.parse_args()
    loads = Loads([1, 8], 1.0, 0.5) if args.smoke else Loads([1, 8], args.seconds, 2)
    plan = floor.Plan(
        args.model_dir, loads, 30 if args.smoke else args.lone_requests, not args.smoke
    )
    results: dict[str, Any] = {
        "command": "python scripts/floor.py" + (" --smoke" if args.smoke else ""),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": describe(),
        "seconds_per_level": loads.seconds,
    }
    results |= floor.run(plan, make_corpus())
    results["bars"] = one_client_bars(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "floor.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({"breakdown": results["breakdown"], "bars": results["bars"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
