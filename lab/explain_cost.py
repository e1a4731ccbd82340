"""What explanations cost predictions: the predictions' p50 at ``concurrency`` closed-loop
clients alone, and with ``explainers`` more clients asking ``/explanations`` side by side.

Rounds alternate (alone, with, alone, with, ...) so that a slow spell of a shared machine falls
on both; each round is bounded in time, and the outcomes of the rounds of a kind are pooled.
``scripts/explain_cost.py`` is the command (docs/handler.md quotes its figures).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from lab.load import ClosedLoop, Job, Outcome, json_job, percentile, statuses


def explain_url(predict_url: str) -> str:
    """``.../predictions/bert`` -> ``.../explanations/bert``."""
    head, _, model = predict_url.rpartition("/predictions/")
    return f"{head}/explanations/{model}"


def explain_job(text: str, n_steps: int | None = None) -> Job:
    body: dict[str, Any] = {"text": text}
    if n_steps is not None:
        body["n_steps"] = n_steps
    return Job(json.dumps(body).encode(), "application/json", expected=text)


async def _side_by_side(loops: Sequence[ClosedLoop]) -> None:
    await asyncio.gather(*(loop.run_async() for loop in loops))


def one_round(
    predict_url: str,
    headers: dict[str, str],
    texts: Sequence[str],
    concurrency: int,
    seconds: float,
    explainers: int = 0,
    n_steps: int | None = None,
) -> tuple[list[Outcome], list[Outcome]]:
    """One bounded round: the predictions' outcomes and the explanations' (none when
    ``explainers`` is 0)."""
    predictions = ClosedLoop(
        predict_url, headers, lambda n: json_job(texts[n % len(texts)]), concurrency, seconds
    )
    loops = [predictions]
    if explainers:
        loops.append(
            ClosedLoop(
                explain_url(predict_url),
                headers,
                lambda n: explain_job(texts[(7 * n) % len(texts)], n_steps),
                explainers,
                seconds,
            )
        )
    asyncio.run(_side_by_side(loops))
    return predictions.outcomes, (loops[1].outcomes if explainers else [])


def latency(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    ok = [outcome.ms for outcome in outcomes if outcome.status == "200"]
    return {
        "requests": len(outcomes),
        "statuses": statuses(outcomes),
        "p50_ms": round(percentile(ok, 50), 1),
        "p90_ms": round(percentile(ok, 90), 1),
    }


def measure(
    predict_url: str,
    headers: dict[str, str],
    texts: Sequence[str],
    concurrency: int = 8,
    seconds: float = 15,
    rounds: int = 2,
    explainers: int = 1,
    n_steps: int | None = None,
    warmup_s: float = 3,
) -> dict[str, Any]:
    """The predictions' p50 alone and beside the explaining clients, their ratio, and what
    the explanations themselves took."""
    one_round(predict_url, headers, texts, concurrency, warmup_s, explainers, n_steps)
    alone: list[Outcome] = []
    beside: list[Outcome] = []
    explained: list[Outcome] = []
    for _ in range(rounds):
        alone += one_round(predict_url, headers, texts, concurrency, seconds)[0]
        predicted, explanations = one_round(
            predict_url, headers, texts, concurrency, seconds, explainers, n_steps
        )
        beside += predicted
        explained += explanations
    without, with_explanations = latency(alone), latency(beside)
    return {
        "concurrency": concurrency,
        "explainers": explainers,
        "n_steps": n_steps,
        "seconds_per_round": seconds,
        "rounds": rounds,
        "predictions_alone": without,
        "predictions_beside_explanations": with_explanations,
        "explanations": latency(explained),
        "p50_ratio": round(with_explanations["p50_ms"] / max(without["p50_ms"], 1e-9), 2),
    }
