"""What a bert-serve server serves: each model's versions, which is the default, its head and labels.

TorchServe 0.12 lists models only on its management API (`GET /models`, `GET /models/{name}/all`,
`GET /models/{name}` for the default version); its inference port has no listing (KServe's
`GET /v2/models/{name}` metadata route is not served there). The head and the labels come from
the handler itself, through the management API's `?customized=true` describe. The management
API listens on 127.0.0.1 only (docs/security.md), so `list_models` runs on the server's machine
(or through a tunnel) with the management key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

from bert_serve.exceptions import BadResponse, ConnectError, ModelNotFound, Unauthorized

DEFAULT_MANAGEMENT_URL = "http://127.0.0.1:8081"
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServedModel:
    """One version of one model as the server serves it."""

    name: str
    version: str
    default: bool
    head: str
    labels: tuple[str, ...]
    architecture: str
    workers: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "default": self.default,
            "head": self.head,
            "labels": list(self.labels),
            "architecture": self.architecture,
            "workers": self.workers,
        }


def _get(url: str, token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.get(url, headers=headers, timeout=TIMEOUT_S)
    except requests.RequestException as error:
        raise ConnectError(f"{url}: {error}") from error
    if response.status_code == 400 and "InvalidKeyException" in response.text:
        raise Unauthorized(
            "token auth is on: pass the management key (--key-file or --token)", status=400
        )
    if response.status_code == 404:
        raise ModelNotFound(response.text[:200], status=404)
    if response.status_code != 200:
        raise BadResponse(f"{url}: {response.status_code} {response.text[:200]}")
    return response.json()


def list_models(
    management_url: str = DEFAULT_MANAGEMENT_URL, token: str | None = None
) -> list[ServedModel]:
    """Every version of every model, in the server's order of names, versions as listed."""
    base = management_url.rstrip("/")
    served = []
    for listed in _get(f"{base}/models", token).get("models", []):
        name = str(listed["modelName"])
        default = str(_get(f"{base}/models/{name}", token)[0]["modelVersion"])
        for entry in _get(f"{base}/models/{name}/all", token):
            version = str(entry["modelVersion"])
            described = _get(f"{base}/models/{name}/{version}?customized=true", token)[0]
            metadata = described.get("customizedMetadata") or {}
            if not isinstance(metadata, dict):
                metadata = {}
            served.append(
                ServedModel(
                    name=name,
                    version=version,
                    default=version == default,
                    head=str(metadata.get("head", "?")),
                    labels=tuple(str(label) for label in metadata.get("labels", [])),
                    architecture=str(metadata.get("architecture", "?")),
                    workers=len(entry.get("workers", [])),
                )
            )
    return served
