"""Poisoning soak: a concurrency-16 closed loop for --seconds, about 10 % of it malformed
(every kind the validator knows, in turn). Every valid answer must be 200 with the scores its
text gets when sent alone (within 1e-4), every malformed one its own 4xx and code."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any
from urllib.parse import urlencode

from lab.batchlog import LogWindow, batch_summary
from lab.chaos.common import (
    FORM,
    MALFORMED,
    Durations,
    closed_loop,
    error_code,
    part_server,
    predict,
)
from lab.corpus import make_corpus
from lab.load import Job, Outcome, json_job, statuses

SCORE_TOLERANCE = 1e-4


def valid_jobs(text: str) -> list[Job]:
    """The same text as JSON, as a raw text/plain body and as a urlencoded form field."""
    return [
        json_job(text),
        Job(text.encode(), "text/plain", expected=text),
        Job(urlencode({"text": text}).encode(), FORM, expected=text),
    ]


def soak_job(index: int, valid: list[Job]) -> Job:
    """Every 10th request is malformed, cycling through every kind; the rest cycle the valid."""
    if index % 10 == 9:
        return MALFORMED[(index // 10) % len(MALFORMED)]
    return valid[(index // 10 * 9 + index % 10) % len(valid)]


def score_diff(body: bytes, reference: dict[str, float]) -> float | None:
    """Largest score difference to ``reference``; None if the body is not such a prediction."""
    try:
        scores = json.loads(body)["scores"]
        if set(scores) != set(reference):
            return None
        return max(abs(float(scores[label]) - value) for label, value in reference.items())
    except (ValueError, KeyError, TypeError):
        return None


def valid_verdict(outcome: Outcome, alone: dict[str, dict[str, float]]) -> tuple[str, float]:
    """("ok" | "failed" | "changed", score difference) of one valid request."""
    if outcome.status != "200":
        return "failed", 0.0
    diff = score_diff(outcome.body, alone[outcome.job.expected])
    if diff is None:
        return "failed", 0.0
    return ("ok" if diff <= SCORE_TOLERANCE else "changed"), diff


def check_valid(outcomes: list[Outcome], alone: dict[str, dict[str, float]]) -> dict[str, Any]:
    verdicts = [valid_verdict(outcome, alone) for outcome in outcomes]
    counts = Counter(verdict for verdict, _ in verdicts)
    return {
        "valid_sent": len(outcomes),
        "valid_ok": counts["ok"],
        "valid_failed": counts["failed"],
        "valid_changed": counts["changed"],
        "valid_failed_statuses": statuses([o for o in outcomes if o.status != "200"]),
        "max_score_diff": max((diff for _, diff in verdicts), default=0.0),
    }


def check_malformed(outcomes: list[Outcome]) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = {job.kind: Counter() for job in MALFORMED}
    wrong = []
    for outcome in outcomes:
        code = error_code(outcome.body)
        by_kind[outcome.job.kind][f"{outcome.status} {code}"] += 1
        if outcome.status != str(outcome.job.status) or code != outcome.job.expected:
            wrong.append(f"{outcome.job.kind}: {outcome.status} {code}")
    return {
        "malformed_sent": len(outcomes),
        "malformed_by_code": {kind: dict(counts) for kind, counts in by_kind.items()},
        "expected": {job.kind: f"{job.status} {job.expected}" for job in MALFORMED},
        "malformed_wrong": len(wrong),
        "malformed_wrong_examples": wrong[:10],
    }


def run(d: Durations) -> dict[str, Any]:
    texts = make_corpus()[:20]
    valid = [job for text in texts for job in valid_jobs(text)]
    with part_server(d) as server:
        alone = {text: predict(server, text)["scores"] for text in texts}
        load = closed_loop(server, lambda i: soak_job(i, valid), 16, d.soak_s)
        with LogWindow(server.model_log) as window:
            load.run()
            time.sleep(0.5)
            batches = batch_summary(window.read())
    result: dict[str, Any] = {"seconds": d.soak_s, "concurrency": 16, "distinct_texts": len(texts)}
    result |= {"requests_sent": load.sent, "silently_lost": load.silently_lost}
    result |= check_valid([o for o in load.outcomes if o.job.kind == "valid"], alone)
    result |= check_malformed([o for o in load.outcomes if o.job.kind != "valid"])
    result["batches"] = batches
    result["passed"] = (
        result["valid_failed"] == result["valid_changed"] == result["malformed_wrong"] == 0
        and result["silently_lost"] == 0
        and result["malformed_sent"] > 0
    )
    result["summary"] = (
        f"{load.sent} requests, {result['valid_ok']} valid ok, {result['valid_failed']} failed, "
        f"{result['valid_changed']} changed, {result['malformed_sent']} malformed "
        f"({result['malformed_wrong']} wrong), max batch {batches['max_batch_size']}"
    )
    return result
