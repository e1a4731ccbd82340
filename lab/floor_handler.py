"""TorchServe's floor: a handler that answers every request with the same constant, reading
nothing and computing nothing. Served on its own (``lab.floor``), it times what TorchServe
itself costs per request on this machine: the frontend, its queue and batch delay, and the
hand-off to the Python worker and back."""

from __future__ import annotations

from typing import Any

from ts.torch_handler.base_handler import BaseHandler

ANSWER = '{"label": "positive", "score": 1.0}'


class ConstantHandler(BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        self.initialized = True

    def handle(self, data: Any, context: Any) -> list[str]:
        return [ANSWER] * len(data or [])
