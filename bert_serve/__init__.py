"""Python client and command line for a bert-serve TorchServe endpoint."""

from bert_serve.client import (
    BertServeError,
    Client,
    ItemError,
    ItemResult,
    Prediction,
    token_from_key_file,
)

__all__ = [
    "BertServeError",
    "Client",
    "ItemError",
    "ItemResult",
    "Prediction",
    "token_from_key_file",
]
