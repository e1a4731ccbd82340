"""The chaos experiments: faults and overload against a real TorchServe, one module each.

Each runs on its own TorchServe (free 127.0.0.1 ports, a temporary state folder, always
stopped at the end; in the quick form the parts on the default config share one,
``common.SharedServer``) and returns its numbers with a pass/fail verdict computed from them:

- ``poisoning_soak``: 10 % malformed traffic; every answer as when sent alone;
- ``worker_crash``: SIGKILL a worker under load; replaced, answering, nothing lost silently;
- ``overload``: a burst over a small queue gets 503s and nothing worse;
- ``oversized``: a body over the frontend's limit gets its 413, the server stays healthy;
- ``restart``: a second server in the same state folder starts and answers the same;
- ``kill_runs``: many worker kills, counting the requests nobody answers (also with a long
  maxBatchDelay);
- ``spike``: patient, 2x and 4x overload with impatient clients, plain and stamped: goodput,
  refusals by status, expired work (numbers reported, not asserted).

``common`` holds what they share (durations, the malformed requests, bounded requests); the
workers they kill and wait for are ``bert_serve_server.control.Server``'s. Every loop is bounded in
count and time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from lab.chaos import (
    kill_runs,
    overload,
    oversized,
    poisoning_soak,
    restart,
    spike,
    worker_crash,
)
from lab.chaos.common import Durations, durations

Experiment = Callable[[Durations], dict[str, Any]]
EXPERIMENTS: dict[str, Experiment] = {
    "poisoning_soak": poisoning_soak.run,
    "worker_crash": worker_crash.run,
    "overload": overload.run,
    "oversized": oversized.run,
    "restart": restart.run,
    "kill_runs": kill_runs.run,
    "kill_runs_long_delay": kill_runs.run_long_delay,
    "spike": spike.run,
}

__all__ = ["EXPERIMENTS", "Durations", "durations", "run_part", "summary_table"]


def run_part(name: str, part: Experiment, d: Durations) -> dict[str, Any]:
    """One part; a part that raises is a failed part, and the others still run."""
    print(f"chaos: {name} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        result = part(d)
    except Exception as error:  # reported as this part's failure
        result = {"passed": False, "error": f"{type(error).__name__}: {error}", "summary": "error"}
    result["part_seconds"] = round(time.monotonic() - started, 1)
    print(f"chaos: {name} {'passed' if result['passed'] else 'FAILED'}", file=sys.stderr)
    return result


def summary_table(report: dict[str, dict[str, Any]]) -> str:
    rows = [f"{'part':<22} {'verdict':<7} {'s':>6}  what happened"]
    for name, result in report.items():
        verdict = "pass" if result["passed"] else "FAIL"
        detail = result.get("error") or result.get("summary", "")
        rows.append(f"{name:<22} {verdict:<7} {result['part_seconds']:>6}  {detail}")
    return "\n".join(rows)
