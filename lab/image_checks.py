"""What ``make image-test`` asks the running image, one check per concern.

Each check takes the container's ``Target`` (its published URLs, and the management API,
which listens inside the container only) and returns the problems it found, none when the
image answered as it should. ``run_checks`` runs every check of ``CHECKS`` and keeps each one's
outcome, a request that raised included, so one run reports every failure, not the first.

To add a check: write ``def my_check(target: Target) -> list[str]`` below and add it, with the
name the run prints, to ``CHECKS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

TIMEOUT_S = 30.0
# The metrics TorchServe itself exports in Prometheus format (config/metrics.yaml adds ours).
FRONTEND_METRICS = ("ts_inference_requests_total", "ts_queue_latency_microseconds")


@dataclass(frozen=True)
class Target:
    """Where a check reaches the image: ``inference`` and ``metrics`` are host URLs
    (``http://127.0.0.1:<port>``); ``management(method, path, body)`` sends a request to the
    management API from inside the container and returns its status and body."""

    inference: str
    metrics: str
    management: Callable[[str, str, bytes], tuple[int, str]]

    @property
    def predict(self) -> str:
        return f"{self.inference}/predictions/bert"


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


Check = Callable[[Target], list[str]]


def problems(*expectations: tuple[bool, str]) -> list[str]:
    """The descriptions of the expectations that do not hold."""
    return [what for holds, what in expectations if not holds]


def post(target: Target, body: Any, path: str = "/predictions/bert") -> tuple[int, Any, str]:
    """POST ``body`` (JSON, or raw text where it is bytes): the status, the JSON answer (None
    where it is not JSON) and the answer as a problem shows it."""
    url = target.inference + path
    if isinstance(body, bytes):
        headers = {"Content-Type": "text/plain"}
        response = requests.post(url, data=body, headers=headers, timeout=TIMEOUT_S)
    else:
        response = requests.post(url, json=body, timeout=TIMEOUT_S)
    try:
        answer = response.json()
    except ValueError:
        answer = None
    return response.status_code, answer, f"{response.status_code} {response.text[:300]!r}"


def labelled(target: Target, body: Any, label: str | None = None) -> tuple[bool, str]:
    """A 200 whose answer has a label (``label`` where given), and the answer shown."""
    status, answer, shown = post(target, body)
    found = answer.get("label") if isinstance(answer, dict) else None
    return status == 200 and found is not None and label in (None, found), shown


def readme_examples(target: Target) -> list[str]:
    """The README's two curl examples, raw text and JSON, with the labels it shows."""
    raw, raw_shown = labelled(target, b"An absolute delight from start to finish.", "positive")
    single, shown = labelled(target, {"text": "A tedious, joyless mess."}, "negative")
    return problems((raw, f"raw text: {raw_shown}"), (single, f"JSON text: {shown}"))


def list_with_an_empty_item(target: Target) -> list[str]:
    """A list answers 200 with one result per text: the empty one an empty_text error."""
    status, answer, shown = post(target, {"texts": ["great film", "", "awful"]})
    results = answer.get("results") if isinstance(answer, dict) else None
    right = (
        status == 200
        and isinstance(results, list)
        and len(results) == 3
        and "label" in results[0]
        and results[1].get("error", {}).get("code") == "empty_text"
    )
    return problems((right, f"list: {shown}"))


def a_pair(target: Target) -> list[str]:
    pair, shown = labelled(target, {"text": "It rains.", "text_pair": "The street is wet."})
    return problems((pair, f"pair: {shown}"))


def open_inference_v2(target: Target) -> list[str]:
    """KServe's v2 protocol over HTTP: two texts in, a label tensor of shape [2] out."""
    texts = {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["great film", "awful"]}
    status, answer, shown = post(target, {"inputs": [texts]}, "/v2/models/bert/infer")
    outputs = answer.get("outputs", []) if isinstance(answer, dict) else []
    shapes = {output.get("name"): output.get("shape") for output in outputs}
    return problems((status == 200 and shapes.get("label") == [2], f"v2: {shown}"))


def prometheus_metrics(target: Target) -> list[str]:
    metrics = requests.get(f"{target.metrics}/metrics", timeout=TIMEOUT_S)
    return problems(
        (metrics.status_code == 200, f"/metrics: {metrics.status_code}"),
        *((name in metrics.text, f"/metrics lacks {name}") for name in FRONTEND_METRICS),
    )


CHECKS: tuple[tuple[str, Check], ...] = (
    ("the README's examples", readme_examples),
    ("a list with an empty item", list_with_an_empty_item),
    ("a sentence pair", a_pair),
    ("Open Inference Protocol (v2) over HTTP", open_inference_v2),
    ("Prometheus /metrics", prometheus_metrics),
)


def run_checks(
    target: Target, checks: tuple[tuple[str, Check], ...] = CHECKS
) -> list[CheckOutcome]:
    """Every check's outcome, in order; a check that raised has that error as its problem."""
    outcomes = []
    for name, check in checks:
        try:
            found = check(target)
        except Exception as error:  # a failed request is this check's outcome too
            found = [f"{type(error).__name__}: {error}"]
        outcomes.append(CheckOutcome(name, tuple(found)))
    return outcomes
