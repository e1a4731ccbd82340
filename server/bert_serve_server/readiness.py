"""What "ready" and "drained" mean, as pure functions of what TorchServe's public APIs answer:
the management API's model descriptions and the metrics API's text. ``ready`` (the pod's
probes and drain) and ``control`` (``make serve``'s wait) both decide with these, so the server
has one definition of each. Standard library only: the probe imports this every few seconds.

- **Serving** (the readiness probe): every version of every model the config serves has at
  least one READY worker. One worker restarting after a crash or a ``responseTimeout`` leaves
  the others serving; the pod stays in the Service.
- **Started** (the startup probe, ``make serve``): every version has workers and all of them
  are READY, as at the end of a start that loaded everything.
- **Drained**: every request TorchServe accepted has been answered. The management API's
  ``pendingRequests`` counts the queue only, not the batches other workers are running, so
  the metrics API is read too: per model, the frontend's ``ts_inference_requests_total``
  (counted as a request is accepted) against the handler's ``BatchItems`` (the requests of
  each batch it answered, config/metrics.yaml). A request the frontend answers without the
  handler (a 503 for a full queue, a batch whose worker died) never reaches ``BatchItems``:
  the difference then stays above 0 and the drain ends at its deadline, erring on waiting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

ACCEPTED = "ts_inference_requests_total"
"""The frontend's count of the requests it accepted, by ``model_name`` and ``model_version``
(``default`` for a request that names no version)."""
ANSWERED = "BatchItems"
"""The handler's count of the requests in the batches it answered (``ModelName``)."""
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)\s*$")


def unready(
    models: Mapping[str, Iterable[str]],
    described: Mapping[str, list[dict[str, Any]] | None],
    every_worker: bool,
) -> list[str]:
    """Why the served models are not ready; empty when they are. ``models``: name -> the
    versions the config serves; ``described``: name -> the management API's ``/models/NAME/all``
    (None where it did not answer). ``every_worker``: all workers READY (started), else at
    least one per version (serving)."""
    problems = []
    for name, versions in models.items():
        entries = described.get(name)
        if entries is None:
            problems.append(f"model {name}: not described by the management API")
            continue
        found = {str(entry.get("modelVersion")): entry.get("workers") or [] for entry in entries}
        for version in versions:
            states = [worker.get("status") for worker in found.get(str(version), [])]
            ready = [state == "READY" for state in states]
            if not states:
                problems.append(f"model {name} {version}: no workers")
            elif not (all(ready) if every_worker else any(ready)):
                problems.append(f"model {name} {version}: workers {states}")
    if not models:
        problems.append("the config serves no model")
    return problems


def pending(described: Mapping[str, list[dict[str, Any]] | None]) -> int:
    """Requests queued for every version of every model (``jobQueueStatus.pendingRequests``)."""
    return sum(
        int((entry.get("jobQueueStatus") or {}).get("pendingRequests", 0))
        for entries in described.values()
        for entry in entries or []
    )


def counts(metrics_text: str, metric: str, label: str) -> dict[str, float]:
    """A counter of the metrics API's text, summed by the value of ``label``."""
    found: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = SAMPLE.match(line)
        if not match or match.group(1) != metric:
            continue
        value = re.search(rf'(?:^|,){label}="([^"]*)"', match.group(2))
        if value:
            found[value.group(1)] = found.get(value.group(1), 0.0) + float(match.group(3))
    return found


def unanswered(metrics_text: str, names: Iterable[str]) -> dict[str, int]:
    """Per model, the requests the frontend accepted that the handler has not answered; only
    models with some left."""
    accepted = counts(metrics_text, ACCEPTED, "model_name")
    answered = counts(metrics_text, ANSWERED, "ModelName")
    left = {name: round(accepted.get(name, 0.0) - answered.get(name, 0.0)) for name in names}
    return {name: count for name, count in left.items() if count > 0}
