"""Restart: answers for 5 texts, stop, a second server in the same state folder (same ports)
starts without any cleanup and gives the same answers (within 1e-6)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bert_serve_server.config import local_port_overrides
from bert_serve_server.control import ServerError, running

from lab.chaos.common import Durations, predict
from lab.corpus import make_corpus

RESTART_TOLERANCE = 1e-6


def answers_from_new_server(
    state_dir: Path, overrides: dict[str, str], texts: list[str]
) -> dict[str, Any]:
    started = time.monotonic()
    with running(overrides, state_dir=state_dir) as server:
        ready_s = round(time.monotonic() - started, 1)
        answers = [predict(server, text)["scores"] for text in texts]
        return {"pid": server.pid(), "ready_s": ready_s, "answers": answers}


def largest_diff(first: list[dict[str, float]], second: list[dict[str, float]]) -> float | None:
    if len(first) != len(second) or any(
        set(a) != set(b) for a, b in zip(first, second, strict=True)
    ):
        return None
    return max(abs(a[k] - b[k]) for a, b in zip(first, second, strict=True) for k in a)


def run(d: Durations) -> dict[str, Any]:
    texts = make_corpus()[:5]
    overrides = local_port_overrides()
    with tempfile.TemporaryDirectory(prefix="chaos-restart-") as state:
        first = answers_from_new_server(Path(state), overrides, texts)
        leftovers = sorted(p.name for p in (Path(state) / "tmp").iterdir())
        second: dict[str, Any] = {}
        try:
            second = answers_from_new_server(Path(state), overrides, texts)
        except (ServerError, OSError) as error:
            second = {"error": f"{type(error).__name__}: {error}", "answers": []}
    diff = largest_diff(first["answers"], second["answers"])
    result: dict[str, Any] = {
        "texts": len(texts),
        "same_state_dir_and_ports": True,
        "first": {k: v for k, v in first.items() if k != "answers"},
        "tmp_files_left_after_stop": leftovers,
        "second": {k: v for k, v in second.items() if k != "answers"},
        "second_start_blocked": "error" in second,
        "max_score_diff": diff,
    }
    result["passed"] = "error" not in second and diff is not None and diff <= RESTART_TOLERANCE
    result["summary"] = (
        f"second start {'blocked' if 'error' in second else 'ok'} "
        f"(pid {first['pid']} -> {second.get('pid')}), max score diff {diff}"
    )
    return result
