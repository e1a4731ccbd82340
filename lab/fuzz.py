"""``make fuzz``: the API fuzzed from docs/openapi.yaml with schemathesis against a real
TorchServe of its own; prints the summary, writes it as ``fuzz.json`` into ``--out``, exits 1
when anything failed.

    python -m lab fuzz --max-examples 500 --max-time 300 --out docs/fuzz

Every answer must conform to the document (status, Content-Type, body, headers) and none may be
a 5xx; the two answers TorchServe's frontend gives before the handler runs are counted, not
failed (``fuzz_checks``). schemathesis runs as its own command (``st run``) with
config/schemathesis.toml; the token reaches it through the environment, never its arguments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bert_serve_server.config import ROOT
from bert_serve_server.control import Server, running

from lab.report import dumps, tool_parser, write_json

OPENAPI = ROOT / "docs" / "openapi.yaml"
CONFIG = ROOT / "config" / "schemathesis.toml"
TOKEN_ENV = "BERT_SERVE_TOKEN"
REFUSALS_ENV = "BERT_SERVE_FUZZ_REFUSALS"


def run_fuzz(server: Server, *, max_examples: int, max_time: int, seed: int) -> dict[str, Any]:
    """One schemathesis run against ``server``, bounded in cases per operation and in seconds;
    its counts as a small dict (``passed`` says whether it found nothing)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as workdir:
        report, refusals = Path(workdir) / "report.json", Path(workdir) / "refusals.jsonl"
        refusals.touch()
        command = [
            str(Path(sys.executable).parent / "st"),
            "--config-file", str(CONFIG),
            "run", str(OPENAPI),
            "--url", server.inference_url,
            "--checks", "conforms",
            "--max-examples", str(max_examples),
            "--max-time", str(max_time),
            "--seed", str(seed),
            "--report", "json", "--report-json-path", str(report),
            "--output-truncate", "true",
        ]  # fmt: skip
        environment = dict(os.environ) | {
            TOKEN_ENV: server.key("inference") or "",
            REFUSALS_ENV: str(refusals),
        }
        done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
        if not report.is_file():
            raise RuntimeError(
                f"schemathesis wrote no report:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
            )
        return summarize(
            json.loads(report.read_text()),
            [json.loads(line) for line in refusals.read_text().splitlines()],
            done.stdout,
        )


def summarize(
    report: dict[str, Any], refusals: list[dict[str, str]], output: str
) -> dict[str, Any]:
    """The counts of schemathesis' JSON report, the frontend refusals, and the output's tail
    when something failed (the reproducing requests)."""
    cases = report["test_cases"]
    return {
        "schemathesis": report["schemathesis_version"],
        "seed": report["seed"],
        "running_time_s": round(report["running_time"], 1),
        "stop_reason": report["stop_reason"],
        "operations_tested": report["operations"]["tested"],
        "phases": {name: phase["status"] for name, phase in report["phases"].items()},
        "test_cases": cases["generated"],
        "test_cases_with_failures": cases["with_failures"],
        "unique_failures": cases["unique_failures"],
        "errors": len(report["errors"]),
        "failures": [
            {key: failure[key] for key in ("code", "title", "count", "operations")}
            for failure in report["failures"]
        ],
        "frontend_refusals": dict(Counter(entry["refusal"] for entry in refusals)),
        "output_tail": output[-6000:] if cases["with_failures"] or report["errors"] else "",
    }


def passed(summary: dict[str, Any]) -> bool:
    return not summary["unique_failures"] and not summary["errors"] and summary["test_cases"] > 0


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("fuzz", __doc__)
    parser.add_argument(
        "--max-examples", type=int, default=30, help="cases per operation per round"
    )
    parser.add_argument("--max-time", type=int, default=45, help="seconds for the whole run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="folder for fuzz.json (the summary)")
    args = parser.parse_args(argv)
    with running(prefix="bert-serve-fuzz-") as server:
        summary = run_fuzz(
            server, max_examples=args.max_examples, max_time=args.max_time, seed=args.seed
        )
    tail = summary.pop("output_tail")
    if args.out:
        write_json(args.out / "fuzz.json", summary)
    print(dumps(summary))
    if tail:
        print(tail, file=sys.stderr)
    return 0 if passed(summary) else 1
