"""Oversized: a body of 1 MiB + 1 byte gets the frontend's 413; then /ping and a valid
prediction still answer 200."""

from __future__ import annotations

from typing import Any

import requests
from bert_serve_server.control import Server

from lab.chaos.common import REQUEST_TIMEOUT_S, Durations, error_code, part_server, ping_status

ONE_MIB = 1024 * 1024


def post_raw(server: Server, data: bytes) -> tuple[int | str, str]:
    headers = server.headers() | {"Content-Type": "text/plain"}
    try:
        response = requests.post(
            server.predict_url, data=data, headers=headers, timeout=REQUEST_TIMEOUT_S
        )
        return response.status_code, response.text[:300]
    except requests.RequestException as error:
        return f"client_{type(error).__name__}", ""


def run(d: Durations) -> dict[str, Any]:
    with part_server(d) as server:
        status, body = post_raw(server, b"a" * (ONE_MIB + 1))
        ping = ping_status(server)
        valid_status, _ = post_raw(server, b"An absolute delight from start to finish.")
    result: dict[str, Any] = {
        "body_bytes": ONE_MIB + 1,
        "status": status,
        "body": body,
        "from_frontend": error_code(body.encode()) is None,
        "ping_after": ping,
        "valid_prediction_after": valid_status,
    }
    result["passed"] = status == 413 and ping == 200 and valid_status == 200
    result["summary"] = (
        f"{status} for 1 MiB + 1 byte, then /ping {ping}, a prediction {valid_status}"
    )
    return result
