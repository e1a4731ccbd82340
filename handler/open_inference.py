"""The Open Inference Protocol (KServe v2) REST inference request, in the same batch as the rest
(shapes: docs/api.md). TorchServe passes the body unchanged; its own ``kservev2`` envelope
would read only the first request of a batch."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from handler.protocol import (
    BODY_KEYS,
    WireProtocol,
    header_value,
    is_explanation,
    is_json,
    is_kserve_route,
    json_type,
    media_type,
    parse_json,
    validate_text,
)
from handler.settings import HandlerSettings
from handler.values import (
    HTTP_STATUS,
    ErrorCode,
    IncomingRequest,
    ItemOutcome,
    Prediction,
    Rejected,
    Response,
    ValidText,
)

INPUTS_FIELD = "inputs"
TEXT_INPUT = "text"
TEXT_PAIR_INPUT = "text_pair"
INPUT_NAMES = (TEXT_INPUT, TEXT_PAIR_INPUT)
LABEL_OUTPUT = "label"
SCORES_OUTPUT = "scores"
TRUNCATED_OUTPUT = "truncated"
OUTPUT_NAMES = (LABEL_OUTPUT, SCORES_OUTPUT, TRUNCATED_OUTPUT)
BINARY_HEADER = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class InferRequest:
    """A valid v2 request: its texts (every one valid) and what the answer must echo."""

    items: tuple[ValidText, ...]
    infer_id: str | None = None
    outputs: tuple[str, ...] = OUTPUT_NAMES
    model_name: str = ""


class OpenInference:
    """Claims JSON bodies with ``"inputs"``, and refuses what KServe's routes cannot take."""

    def decode(
        self, request: IncomingRequest, settings: HandlerSettings
    ) -> InferRequest | Rejected | None:
        decoded = decode_infer(request, settings)
        if isinstance(decoded, InferRequest) and is_explanation(request.headers):
            return Rejected(
                ErrorCode.NOT_EXPLAINABLE,
                "the Open Inference Protocol (v2) has no explanations here; send "
                '{"text": "..."} or {"instances": [...]} to /explanations/{model} or '
                "/v1/models/{model}:explain",
            )
        return decoded

    def render(
        self, decoded: InferRequest, outcomes: tuple[ItemOutcome, ...], request_id: str
    ) -> Response:
        """The output tensors; one failed text fails the request (no per-item error in v2)."""
        failed = next((item for item in outcomes if isinstance(item, Rejected)), None)
        if failed is not None:
            return self.refuse(failed, request_id)
        predictions = [item for item in outcomes if isinstance(item, Prediction)]
        body = {
            "model_name": decoded.model_name,
            "id": decoded.infer_id if decoded.infer_id is not None else request_id,
            "outputs": output_tensors(predictions, decoded.outputs),
        }
        return Response(200, "OK", json.dumps(body))

    def refuse(self, rejected: Rejected, request_id: str) -> Response:
        status, phrase = HTTP_STATUS[rejected.code]
        return Response(
            status, phrase, json.dumps({"error": f"{rejected.code.value}: {rejected.message}"})
        )


PROTOCOL: WireProtocol[InferRequest] = OpenInference()


def decode_infer(
    request: IncomingRequest, settings: HandlerSettings
) -> InferRequest | Rejected | None:
    """The request as a v2 request, or None when it is not one (the usual decoding applies)."""
    if header_value(request.headers, BINARY_HEADER) is not None:
        return Rejected(
            ErrorCode.INVALID_TYPE,
            f"binary tensor data ({BINARY_HEADER}) is not supported; send the tensors as JSON "
            "(tritonclient: set_data_from_numpy(..., binary_data=False))",
        )
    media = media_type(request.content_type)
    if not is_json(media):
        if is_kserve_route(request.headers):
            return Rejected(
                ErrorCode.INVALID_TYPE,
                f"KServe's v1 and v2 routes take JSON bodies (Content-Type: application/json "
                f"or none), got {media!r}; binary tensor data is not supported",
            )
        return None
    body = next((request.fields[key] for key in BODY_KEYS if key in request.fields), None)
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    if not isinstance(body, bytes | bytearray) or f'"{INPUTS_FIELD}"'.encode() not in body:
        return None
    document = parse_json(body)
    if not isinstance(document, dict) or INPUTS_FIELD not in document:
        return None
    return decode_infer_document(
        document, request.model_name, settings.max_chars, settings.max_texts_per_request
    )


def decode_infer_document(
    document: Mapping[str, Any], model_name: str, max_chars: int, max_texts: int
) -> InferRequest | Rejected:
    """A parsed v2 request: the envelope, the tensors, then each text."""
    infer_id = document.get("id")
    if infer_id is not None and not isinstance(infer_id, str):
        return _invalid(f'"id" must be a string, got {json_type(infer_id)}')
    outputs = _requested_outputs(document.get("outputs"))
    if isinstance(outputs, Rejected):
        return outputs
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        return _invalid(f'"parameters" must be an object, got {json_type(parameters)}')
    tensors = _input_tensors(document[INPUTS_FIELD], max_texts)
    if isinstance(tensors, Rejected):
        return tensors
    texts, pairs = tensors
    items: list[ValidText] = []
    for index, text in enumerate(texts):
        item = _valid_item(index, text, None if pairs is None else pairs[index], max_chars)
        if isinstance(item, Rejected):
            return item
        items.append(item)
    return InferRequest(
        items=tuple(items), infer_id=infer_id, outputs=outputs, model_name=model_name
    )


def _requested_outputs(outputs: Any) -> tuple[str, ...] | Rejected:
    if outputs is None:
        return OUTPUT_NAMES
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        return _invalid(f'"outputs" must be an array of objects, got {json_type(outputs)}')
    names = tuple(output.get("name") for output in outputs)
    unknown = [name for name in names if name not in OUTPUT_NAMES]
    if unknown:
        return _invalid(f"unknown output {unknown[0]!r}; this model has {list(OUTPUT_NAMES)}")
    return tuple(str(name) for name in names)


def _input_tensors(inputs: Any, max_texts: int) -> tuple[list[Any], list[Any] | None] | Rejected:
    """The ``text`` tensor's elements and, when sent, the ``text_pair`` tensor's."""
    if not isinstance(inputs, list) or not all(isinstance(i, dict) for i in inputs):
        return _invalid(f'"inputs" must be an array of tensor objects, got {json_type(inputs)}')
    names = [tensor.get("name") for tensor in inputs]
    unknown = [name for name in names if name not in INPUT_NAMES]
    if unknown:
        return _invalid(f"unknown input {unknown[0]!r}; this model takes {list(INPUT_NAMES)}")
    if len(set(names)) != len(names):
        return _invalid(f"each input may be sent once, got {names}")
    if TEXT_INPUT not in names:
        return Rejected(ErrorCode.MISSING_FIELD, f'no "{TEXT_INPUT}" input; got {names}')
    elements: dict[str, list[Any]] = {}
    shapes: dict[str, list[int]] = {}
    for tensor in inputs:
        shape = _text_shape(tensor, max_texts)
        if isinstance(shape, Rejected):
            return shape
        data = _tensor_data(tensor, shape)
        if isinstance(data, Rejected):
            return data
        elements[tensor["name"]], shapes[tensor["name"]] = data, shape
    if TEXT_PAIR_INPUT in shapes and shapes[TEXT_PAIR_INPUT] != shapes[TEXT_INPUT]:
        return _invalid(
            f'"{TEXT_PAIR_INPUT}" has shape {shapes[TEXT_PAIR_INPUT]}, '
            f'"{TEXT_INPUT}" has {shapes[TEXT_INPUT]}; they must match'
        )
    return elements[TEXT_INPUT], elements.get(TEXT_PAIR_INPUT)


def _text_shape(tensor: Mapping[str, Any], max_texts: int) -> list[int] | Rejected:
    name = tensor["name"]
    if tensor.get("datatype") != "BYTES":
        return _invalid(
            f'input "{name}" must have datatype "BYTES", got {tensor.get("datatype")!r}'
        )
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or len(shape) not in (1, 2)
        or (len(shape) == 2 and shape[1] != 1)
        or shape[0] < 0
    ):
        return _invalid(f'input "{name}" must have shape [n] or [n, 1], got {shape!r}')
    if shape[0] == 0:
        return Rejected(ErrorCode.EMPTY_TEXT, f'input "{name}" has no texts')
    if shape[0] > max_texts:
        return Rejected(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f'input "{name}" has {shape[0]:,} texts; the limit is {max_texts:,}',
        )
    return shape


def _tensor_data(tensor: Mapping[str, Any], shape: list[int]) -> list[Any] | Rejected:
    """The elements in row-major order; the protocol allows flat or nested arrays."""
    name = tensor["name"]
    parameters = tensor.get("parameters")
    if "data" not in tensor:
        if isinstance(parameters, dict) and "binary_data_size" in parameters:
            return _invalid(
                f'input "{name}" is binary tensor data, which is not supported; send it as JSON '
                '"data" (tritonclient: binary_data=False)'
            )
        return Rejected(ErrorCode.MISSING_FIELD, f'input "{name}" has no "data"')
    data = tensor["data"]
    flat = _flatten(data, len(shape))
    count = math.prod(shape)
    if flat is None or len(flat) != count:
        return _invalid(f'input "{name}" must hold {count} elements for shape {shape}')
    return flat


def _flatten(data: Any, depth: int) -> list[Any] | None:
    """A flat list from at most ``depth`` levels of arrays; None if ``data`` is not an array."""
    if not isinstance(data, list):
        return None
    flat: list[Any] = []
    for element in data:
        if not isinstance(element, list):
            flat.append(element)
            continue
        inner = _flatten(element, depth - 1) if depth > 1 else None
        if inner is None:
            return None
        flat += inner
    return flat


def _valid_item(index: int, text: Any, pair: Any, max_chars: int) -> ValidText | Rejected:
    """One text (and its pair) checked like any text; the error names its place."""
    for name, value in ((TEXT_INPUT, text), (TEXT_PAIR_INPUT, pair)):
        if value is None and name == TEXT_PAIR_INPUT:
            continue
        if not isinstance(value, str):
            return _invalid(f"{name}[{index}] must be a string, got {json_type(value)}")
        checked = validate_text(value, max_chars)
        if isinstance(checked, Rejected):
            return Rejected(checked.code, f"{name}[{index}]: {checked.message}")
    return ValidText(text, pair)


def output_tensors(predictions: list[Prediction], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The requested outputs, in the requested order, for one row per prediction."""
    labels = list(predictions[0].scores)
    count = len(predictions)
    tensors: dict[str, dict[str, Any]] = {
        LABEL_OUTPUT: {
            "datatype": "BYTES",
            "shape": [count],
            "data": [p.label for p in predictions],
        },
        SCORES_OUTPUT: {
            "datatype": "FP32",
            "shape": [count, len(labels)],
            "parameters": {"labels": json.dumps(labels)},
            "data": [p.scores[label] for p in predictions for label in labels],
        },
        TRUNCATED_OUTPUT: {
            "datatype": "BOOL",
            "shape": [count],
            "data": [p.truncated for p in predictions],
        },
    }
    return [{"name": name, **tensors[name]} for name in names]


def _invalid(message: str) -> Rejected:
    return Rejected(ErrorCode.INVALID_TYPE, message)
