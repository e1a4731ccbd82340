"""TorchServe entry point, at the root of the .mar beside the ``handler`` package: wires its
pure stages to TorchServe's context. It must define exactly one class: TorchServe looks it up."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ts.torch_handler.base_handler import BaseHandler

from handler.deadline import Pace
from handler.explain import Budget, explain_all
from handler.inference import Admit, Windows, classify_admitted
from handler.metrics import MetricsEmitter, ModelMetrics, read_profile
from handler.model import LoadedModel, description, head_kind, load_model, settled_precision
from handler.pipeline import FALLBACK, answer_batch
from handler.protocol import BODY_KEYS, JSON_MEDIA, header_value, route_content_type
from handler.settings import HandlerSettings, worker_threads
from handler.values import (
    BatchStats,
    ErrorCode,
    ExplainOptions,
    Explanation,
    IncomingRequest,
    Prediction,
    Rejected,
    TextInput,
)

logger = logging.getLogger(__name__)

MODEL_SUBDIR = "model"
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")


def request_id_for(headers: Mapping[str, Any], torchserve_id: str) -> str:
    """The client's X-Request-ID when it is a sane token, else TorchServe's own UUID."""
    client_id = (header_value(headers, "X-Request-ID") or "").strip()
    return client_id if SANE_REQUEST_ID.fullmatch(client_id) else torchserve_id


def content_type_for(headers: Mapping[str, Any], fields: Mapping[str, Any]) -> str | None:
    """The request's Content-Type, else the one TorchServe recorded for the body field."""
    content_type = header_value(headers, "Content-Type")
    if content_type is None:
        for key in BODY_KEYS:
            per_field = headers.get(key)
            if key in fields and isinstance(per_field, dict):
                content_type = per_field.get("content-type") or None
    return content_type


def incoming_requests(data: Sequence[Any], context: Any) -> list[IncomingRequest]:
    requests = []
    for index, fields in enumerate(data):
        headers = context.get_all_request_header(index) or {}
        fields = fields if isinstance(fields, dict) else {}
        requests.append(
            IncomingRequest(
                fields=fields,
                content_type=route_content_type(headers, content_type_for(headers, fields)),
                request_id=request_id_for(headers, str(context.get_request_id(index))),
                headers=headers,
                model_name=str(context.model_name),
            )
        )
    return requests


class BertHandler(BaseHandler):  # type: ignore[misc]
    """Validates each request, classifies the valid ones in batches, answers each by index."""

    def initialize(self, context: Any) -> None:
        properties = context.system_properties
        config = context.model_yaml_config or {}
        settings = HandlerSettings.from_mapping(config.get("handler"))
        self.version = str(((context.manifest or {}).get("model") or {}).get("modelVersion", ""))
        key = f"{context.model_name}:{self.version}"
        settings, precision = settled_precision(settings, key, os.environ)
        logger.info("%s", precision)
        threads = worker_threads(settings.torch_threads, os.environ)
        self.settings = replace(settings, torch_threads=threads)
        archive_dir = Path(properties["model_dir"])
        model_dir = archive_dir / MODEL_SUBDIR
        if not model_dir.is_dir():
            model_dir = archive_dir
        gpu_id = properties.get("gpu_id")
        gpu_id = int(gpu_id) if gpu_id is not None and int(gpu_id) >= 0 else None
        self.loaded: LoadedModel = load_model(model_dir, self.settings, gpu_id)
        self.metrics = MetricsEmitter(context.metrics, context.model_name, self.version)
        self.model_metrics = ModelMetrics(
            context.metrics,
            context.model_name,
            self.version,
            head_kind(self.loaded),
            self.loaded.labels,
            read_profile(archive_dir),
        )
        self.windows = Windows.of(self.settings)
        self.pace = Pace()
        self.explain_budget = Budget.for_timeout(config.get("responseTimeout"))
        self.initialized = True

    def classify(
        self, texts: Sequence[TextInput], windowed: Sequence[bool], admit: Admit | None
    ) -> tuple[list[Prediction | None], BatchStats]:
        """The model's predictions; what it said is counted here, before a request's options
        reshape its answer."""
        predictions, stats = classify_admitted(
            self.loaded,
            texts,
            self.settings.max_length,
            self.loaded.max_batch_tokens,
            self.windows,
            windowed,
            admit,
        )
        self.model_metrics.emit([p for p in predictions if p is not None])
        return predictions, stats

    def explain_texts(
        self, items: Sequence[tuple[TextInput, ExplainOptions]]
    ) -> list[Explanation | Rejected]:
        return explain_all(self.loaded, items, self.settings, self.explain_budget)

    def handle(self, data: Any, context: Any) -> list[str]:
        received = time.perf_counter()
        batch = list(data or [])
        if len(batch) == 1 and context.get_request_header(0, "describe") == "True":
            # the management API's describe (?customized=true): TorchServe sends it alone
            answer = description(self.loaded, self.settings, context.model_name, self.version)
            return [json.dumps(answer)]
        try:
            responses, headers = answer_batch(
                incoming_requests(batch, context),
                self.classify,
                self.settings,
                observe=self.metrics.emit,
                received=received,
                pace=self.pace,
                explainer=self.explain_texts,
            )
            for index, (response, timings) in enumerate(zip(responses, headers, strict=True)):
                context.set_response_status(response.status, response.phrase, index)
                context.set_response_content_type(index, JSON_MEDIA)
                for name, value in timings:
                    context.set_response_header(index, name, value)
            return [response.body for response in responses]
        except Exception:
            logger.exception("handle failed for a batch of %d; this is a bug", len(batch))
            return _internal_errors(batch, context)


def _internal_errors(batch: Sequence[Any], context: Any) -> list[str]:
    """Last resort when the wiring itself failed: 500 for each request, in the usual shape."""
    failure = Rejected(ErrorCode.INTERNAL_ERROR, "the batch failed (server bug)")
    bodies = []
    for index in range(len(batch)):
        response = FALLBACK.refuse(failure, str(context.get_request_id(index)))
        context.set_response_status(response.status, response.phrase, index)
        context.set_response_content_type(index, JSON_MEDIA)
        bodies.append(response.body)
    return bodies
