"""``make chaos``: faults and overload against a real TorchServe, each part with a verdict from
its numbers (docs/chaos/README.md says what each injects and requires): the short ones in
``faults``, the worker kills in ``kill_runs``, the impatient clients in ``spike``. Each part has
its own server, always stopped; in ``--quick`` the parts on the default config share one
(``SharedServer``). Every loop is bounded in count and time. Writes ``chaos.json`` ({part:
result}; with ``--only`` the other parts in it are kept) and, with the spike, ``spike.png``;
exits 1 if a part failed. Its servers serve fp32 unless ``BERT_SERVE_PRECISION`` says: the soak
and the restart want scores within 1e-4 and 1e-6; bf16's batch-mates move them by up to 5e-3.

    python -m lab chaos --quick --out /tmp/chaos     # every duration a few seconds
    python -m lab chaos --only kill_runs --kills 50 --out docs/chaos
    python -m lab chaos --only spike --forms stamped --no-peer --set job_queue_size=160 --out DIR
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from bert_serve_server.control import REPLACE_LIMIT_S, Server, running
from bert_serve_server.sizing import VARIABLES

from bert_serve.client import DEFAULT_TIMEOUT_S
from lab.load import ClosedLoop, Job, percentile
from lab.report import tool_parser, write_json

FORM = "application/x-www-form-urlencoded"
REQUEST_TIMEOUT_S = 30.0
RECOVERY_LIMIT_S = REPLACE_LIMIT_S
SPIKE_FORMS = ("plain", "timeout", "stamped")
"""The spike's request forms (``lab.chaos.spike``)."""
QUICK_ATTEMPT_S = 20.0
"""The quick form's wait for one answer in the kill runs (``Durations.attempt_s``): a request
TorchServe drops at a kill keeps its run waiting this long, not the client's default 70 s.
Healthy answers come well inside it: in the quick runs' heavier level (16 raw clients, 16
Client threads, a worker being replaced) the slowest took 0.63 s on 2 cores (the report's
``slowest_answer_s``)."""


class SharedServer:
    """The server of the default config, started by the first part that asks for it and kept
    for the parts after it that run on that config, until ``close``: the quick form's parts
    take a few seconds each, about what a start takes."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._server: Server | None = None

    def get(self) -> Server:
        if self._server is None:
            self._server = self._stack.enter_context(running())
        return self._server

    def close(self) -> None:
        self._stack.close()


@dataclass(frozen=True)
class Durations:
    soak_s: float
    crash_before_kill_s: float
    crash_after_recovery_s: float
    kills: int = 50
    long_delay_kills: int = 50
    """Kills per load level of the kill runs at maxBatchDelay 20 ms (``kill_runs_long_delay``)."""
    attempt_s: float = DEFAULT_TIMEOUT_S
    """The kill runs' wait for one answer: the raw clients' deadline, and ``bert_serve.Client``'s
    per-attempt timeout before its retry (the client's default, which docs/chaos/README.md
    gives raw clients too: responseTimeout + 10 s)."""
    spike_s: float = 15.0
    spike_set: dict[str, str] = field(default_factory=dict)
    """config.properties overrides for the spike part's server (``--set``): to compare
    configs or model stores (``model_store=...``) under the same spike."""
    spike_forms: tuple[str, ...] = SPIKE_FORMS
    spike_peer: bool = True
    shared: SharedServer | None = None
    """Where set (the quick form), the parts on the default config run on this one server."""


@contextmanager
def part_server(d: Durations, overrides: dict[str, str] | None = None) -> Iterator[Server]:
    """A part's server: the run's shared one where there is one and the part runs on the
    default config; else one of its own, stopped when the part ends."""
    if d.shared is not None and not overrides:
        yield d.shared.get()
        return
    with running(overrides) as server:
        yield server


def durations(seconds: float, quick: bool, kills: int | None = None) -> Durations:
    """``kills`` per load level of the kill runs, 50 by default; in the quick form 2 (a
    replaced worker killed again), and 1 in the long-delay runs (their wider window), each
    answer waited for ``QUICK_ATTEMPT_S``."""
    if not quick:
        full = Durations(soak_s=seconds, crash_before_kill_s=3.0, crash_after_recovery_s=5.0)
        return (
            full
            if kills is None
            else dataclasses.replace(full, kills=kills, long_delay_kills=kills)
        )
    return Durations(
        soak_s=min(seconds, 4.0),
        crash_before_kill_s=1.0,
        crash_after_recovery_s=1.0,
        kills=2 if kills is None else kills,
        long_delay_kills=1 if kills is None else kills,
        attempt_s=QUICK_ATTEMPT_S,
        spike_s=1.0,
    )


def malformed(kind: str, data: bytes, content_type: str, code: str, status: int = 400) -> Job:
    return Job(data, content_type, kind=kind, expected=code, status=status)


MALFORMED = (
    malformed("empty_text", b"  \n\t ", "text/plain", "empty_text"),
    malformed("missing_field", b'{"txt": "hi"}', "application/json", "missing_field"),
    malformed("invalid_type", b'{"text": 42}', "application/json", "invalid_type"),
    malformed("invalid_json", b'{"text": "unterminated', "application/json", "invalid_json"),
    malformed("invalid_encoding", b"caf\xc3\xa9 \xff\xfe", "text/plain", "invalid_encoding"),
    malformed("payload_too_large", b"a" * 10_001, "text/plain", "payload_too_large", 413),
    malformed("form_without_text", b"great film", FORM, "missing_field"),
)
"""Every kind of malformed request the validator knows, with the status and code it gets."""


def closed_loop(
    server: Server, job_for: Callable[[int], Job], concurrency: int, seconds: float, **options: Any
) -> ClosedLoop:
    """A load on the server's predictions endpoint, each request bounded by REQUEST_TIMEOUT_S."""
    return ClosedLoop(
        server.predict_url, server.headers(), job_for, concurrency, seconds,
        request_timeout_s=REQUEST_TIMEOUT_S, **options,
    )  # fmt: skip


def predict(server: Server, text: str) -> dict[str, Any]:
    response = requests.post(
        server.predict_url, json={"text": text}, headers=server.headers(), timeout=REQUEST_TIMEOUT_S
    )
    response.raise_for_status()
    return dict(response.json())


def ping_status(server: Server) -> int | str:
    try:
        url = f"{server.inference_url}/ping"
        return requests.get(url, headers=server.headers(), timeout=10).status_code
    except requests.RequestException as error:
        return f"client_{type(error).__name__}"


def error_code(body: bytes) -> str | None:
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def latency(values: list[float]) -> dict[str, float | int]:
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 50), 1),
        "p99_ms": round(percentile(values, 99), 1),
    }


Experiment = Callable[[Durations], dict[str, Any]]


def experiments() -> dict[str, Experiment]:
    """Every part, in the order a run takes them (imported here: each part imports this)."""
    from lab.chaos import faults, kill_runs, spike

    return {
        "poisoning_soak": faults.poisoning_soak,
        "worker_crash": kill_runs.worker_crash,
        "overload": faults.overload,
        "oversized": faults.oversized,
        "restart": faults.restart,
        "kill_runs": kill_runs.run,
        "kill_runs_long_delay": kill_runs.run_long_delay,
        "spike": spike.run,
    }


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


def assignments(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` arguments (config.properties keys) as a mapping."""
    pairs = [item.partition("=") for item in items]
    if bad := [
        item for item, (key, sign, _) in zip(items, pairs, strict=True) if not (key and sign)
    ]:
        raise SystemExit(f"settings must be KEY=VALUE, got {bad}")
    return {key: value for key, _, value in pairs}


def main(argv: list[str] | None = None) -> int:
    parts = experiments()
    parser = tool_parser("chaos", __doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/chaos"))
    parser.add_argument("--seconds", type=float, default=30.0, help="soak duration")
    parser.add_argument("--quick", action="store_true", help="every duration a few seconds")
    parser.add_argument("--only", nargs="+", choices=parts, help="run these parts only")
    parser.add_argument(
        "--kills", type=int, help="worker kills per load level (50; quick: 2, 1 at 20 ms)"
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="spike: config overrides"
    )
    parser.add_argument("--forms", nargs="+", choices=SPIKE_FORMS, default=list(SPIKE_FORMS))
    parser.add_argument("--no-peer", action="store_true", help="spike: without LitServe")
    args = parser.parse_args(argv)
    os.environ.setdefault(VARIABLES["precision"], "fp32")  # the module docstring says why
    shared = SharedServer() if args.quick else None
    plan = dataclasses.replace(
        durations(args.seconds, args.quick, args.kills),
        spike_set=assignments(args.set),
        spike_forms=tuple(args.forms),
        spike_peer=not args.no_peer,
        shared=shared,
    )
    started = time.monotonic()
    try:
        report = {name: run_part(name, parts[name], plan) for name in args.only or parts}
    finally:
        if shared is not None:
            shared.close()
    path = args.out / "chaos.json"
    kept = json.loads(path.read_text()) if args.only and path.is_file() else {}
    write_json(path, kept | report)
    if "levels" in report.get("spike", {}):
        from lab.chaos.spike import plot

        plot(report["spike"], args.out)
    passed = sum(result["passed"] for result in report.values())
    print(summary_table(report))
    print(f"report: {path} ({time.monotonic() - started:.0f} s)")
    print(f"chaos: {passed} passed, {len(report) - passed} failed")
    return 0 if passed == len(report) else 1
