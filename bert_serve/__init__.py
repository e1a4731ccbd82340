"""Python client and command line for a bert-serve TorchServe endpoint.

Imports nothing beyond the standard library, `requests` and `tqdm`: the client installs
without the server.
"""

from bert_serve.client import (
    Client,
    Explanation,
    ItemError,
    ItemResult,
    Prediction,
    Text,
    token_from_key_file,
)
from bert_serve.exceptions import (
    BadResponse,
    BertServeError,
    BodyTooLarge,
    ConnectError,
    DeadlineExceeded,
    ErrorCode,
    InvalidKeyFile,
    InvalidText,
    ModelFailed,
    ModelNotFound,
    Rejected,
    RequestFailed,
    ServerError,
    TextTooLong,
    Timeout,
    TransportError,
    Unauthorized,
    Unavailable,
    UnexpectedStatus,
    WorkerDied,
)

__all__ = [
    "BadResponse",
    "BertServeError",
    "BodyTooLarge",
    "Client",
    "ConnectError",
    "DeadlineExceeded",
    "ErrorCode",
    "Explanation",
    "InvalidKeyFile",
    "InvalidText",
    "ItemError",
    "ItemResult",
    "ModelFailed",
    "ModelNotFound",
    "Prediction",
    "Rejected",
    "RequestFailed",
    "ServerError",
    "Text",
    "TextTooLong",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnexpectedStatus",
    "WorkerDied",
    "token_from_key_file",
]
