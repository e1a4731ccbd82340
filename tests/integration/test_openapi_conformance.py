"""schemathesis, driven by docs/openapi.yaml, against the real server of the session.

Bounded twice: at most MAX_EXAMPLES cases per operation per round and MAX_TIME_S for the run
(schemathesis keeps fuzzing until that is spent). `make fuzz` is the longer run.
"""

from __future__ import annotations

import json

from lab.fuzz import passed, run_fuzz

MAX_EXAMPLES = 30
MAX_TIME_S = 45


def test_every_answer_conforms_and_none_is_a_server_error(server) -> None:
    summary = run_fuzz(server, max_examples=MAX_EXAMPLES, max_time=MAX_TIME_S, seed=20261122)
    tail = summary.pop("output_tail")
    assert passed(summary), f"{json.dumps(summary, indent=2)}\n{tail}"
    assert summary["operations_tested"] == 5
    assert summary["phases"]["examples"] == "success"
