"""schemathesis hooks for `fuzz.run_fuzz` (config/schemathesis.toml loads them): `conforms` runs
schemathesis' own checks on every answer, except the two TorchServe's frontend gives before any
handler runs (docs/openapi.yaml documents both): 413 with no body for a body over
`max_request_size`, and 500 `ErrorDataDecoderException` for a form it cannot decode. Those are
appended as JSON lines to $BERT_SERVE_FUZZ_REFUSALS and counted. A 504 `deadline_exceeded` is
checked against the document, but not failed for being a 5xx.
"""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

REFUSALS_ENV = "BERT_SERVE_FUZZ_REFUSALS"
FORM_MEDIA_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
BUILT_IN_CHECKS = (
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
)


def frontend_refusal(
    status: int, content_type: str | None, body: bytes, request_media: str
) -> str | None:
    """The name of TorchServe's frontend answer this is, or None for an answer to check."""
    if status == 413 and not body and not content_type:
        return "body_over_max_request_size"
    if status == 500 and request_media.startswith(FORM_MEDIA_TYPES):
        try:
            kind = json.loads(body).get("type")
        except (ValueError, AttributeError):
            return None
        if kind == "ErrorDataDecoderException":
            return "form_decoder_error"
    return None


@schemathesis.check
def conforms(ctx: Any, response: Any, case: Any) -> None:
    """Every answer conforms to docs/openapi.yaml and none is a 5xx, except TorchServe frontend
    refusals (module docstring), which are counted."""
    refusal = frontend_refusal(
        response.status_code,
        next(iter(response.headers.get("content-type", [])), None),
        response.content or b"",
        str(response.request.headers.get("Content-Type") or "").lower(),
    )
    if refusal is not None:
        _record(refusal, case)
        return
    checks: tuple[Any, ...] = BUILT_IN_CHECKS
    if response.status_code == 504 and b'"deadline_exceeded' in (response.content or b""):
        checks = tuple(check for check in BUILT_IN_CHECKS if check is not not_a_server_error)
    for check in checks:
        check(ctx, response, case)


def _record(refusal: str, case: Any) -> None:
    path = os.environ.get(REFUSALS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"refusal": refusal, "operation": case.operation.label}) + "\n")
