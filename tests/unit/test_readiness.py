"""server/bert_serve_server/ready.py: serving, started and drained as pure functions of the
management and metrics APIs' answers (shapes of TorchServe 0.12)."""

from __future__ import annotations

from typing import Any

from bert_serve_server import ready
from bert_serve_server.config import unready


def described(*states: str, version: str = "1.0", pending: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "modelVersion": version,
            "workers": [{"id": str(i), "status": state} for i, state in enumerate(states)],
            "jobQueueStatus": {"remainingCapacity": 100, "pendingRequests": pending},
        }
    ]


def test_serving_needs_one_ready_worker_per_version_started_needs_all() -> None:
    models = {"bert": ["1.0"]}
    one_restarting = {"bert": described("READY", "UNLOADED")}
    assert unready(models, one_restarting, every_worker=False) == []
    assert unready(models, one_restarting, every_worker=True) == [
        "model bert 1.0: workers ['READY', 'UNLOADED']"
    ]
    none_ready = {"bert": described("UNLOADED", "UNLOADED")}
    assert unready(models, none_ready, every_worker=False)
    assert unready(models, {"bert": described()}, every_worker=False) == [
        "model bert 1.0: no workers"
    ]


def test_every_served_version_and_model_counts() -> None:
    models = {"bert": ["1.0"], "nli": ["1", "2"]}
    answers = {"bert": described("READY"), "nli": described("READY", version="1")}
    assert unready(models, answers, every_worker=False) == ["model nli 2: no workers"]
    assert unready(models, {"bert": described("READY"), "nli": None}, False) == [
        "model nli: not described by the management API"
    ]
    assert unready({}, {}, every_worker=False) == ["the config serves no model"]


METRICS = """\
# HELP ts_inference_requests_total Total number of inference requests received.
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="bert",model_version="default",hostname="pod",} 120.0
ts_inference_requests_total{model_name="bert",model_version="1.0",hostname="pod",} 5.0
ts_inference_requests_total{model_name="nli",model_version="default",hostname="pod",} 9.0
# TYPE BatchItems counter
BatchItems{ModelName="bert",Level="Model",Hostname="pod",ModelVersion="1.0",} 118.0
BatchItems{ModelName="nli",Level="Model",Hostname="pod",ModelVersion="1",} 9.0
BatchItemsOther{ModelName="bert",Level="Model",} 1000.0
"""


def test_unanswered_compares_accepted_with_answered_per_model_over_versions() -> None:
    """Requests without a version are counted under "default" by the frontend and under the
    version that served them by the handler: the sum per model name compares them."""
    assert ready.unanswered(METRICS, ["bert", "nli"]) == {"bert": 7}
    answered = METRICS.replace("} 118.0", "} 125.0")
    assert ready.unanswered(answered, ["bert", "nli"]) == {}
    assert ready.unanswered("", ["bert"]) == {}
    assert ready.unanswered(METRICS, ["absent"]) == {}
