"""The benchmarks' reference peer (``lab.peer`` starts it): a LitServe server of the same model.

What a team would write instead of bert-serve: one LitAPI over the same model folder and the
same tokenization and forward code. By default it is what LitServe gives out of the box (one
worker, torch's own thread count, no batching); the flags configure it like bert-serve's
default (``--workers 2 --torch-threads 1 --max-batch-size 16 --batch-timeout-ms 1``), LitServe's
own dynamic batching included. ``--accelerator cuda`` puts
``--workers`` workers on each GPU (LitServe's ``workers_per_device``), each with the handler's
``--precision``; ``--api-servers 0`` leaves LitServe's HTTP processes at its own default (as
many as its workers). Installed with the ``dev`` extra.

    python -m lab.litserve_peer --model-dir build/bert-sentiment --port 8100
"""

import argparse
from pathlib import Path
from typing import Any

import litserve as ls

from handler.inference import classify
from handler.model import load_model
from handler.settings import HandlerSettings


class SentimentAPI(ls.LitAPI):  # type: ignore[misc]
    def __init__(self, model_dir: Path, settings: HandlerSettings, batch: int, timeout_s: float):
        super().__init__(max_batch_size=batch, batch_timeout=timeout_s)
        self.model_dir, self.settings = model_dir, settings

    def setup(self, device: str) -> None:
        """``device`` is LitServe's: ``cpu`` or ``cuda:N``."""
        gpu_id = int(device.partition(":")[2] or 0) if device.startswith("cuda") else None
        self.loaded = load_model(self.model_dir, self.settings, gpu_id=gpu_id)

    def decode_request(self, request: dict) -> str:  # type: ignore[type-arg]  # LitServe reads this plain dict annotation
        return str(request["text"])

    def batch(self, texts: list[str]) -> list[str]:
        return texts

    def predict(self, texts: str | list[str]) -> dict[str, Any] | list[dict[str, Any]]:
        batch = texts if isinstance(texts, list) else [texts]
        length, tokens = self.settings.max_length, self.loaded.max_batch_tokens
        predictions, _ = classify(self.loaded, batch, length, tokens)
        answers = [{"label": p.label, "score": p.score, "scores": p.scores} for p in predictions]
        return answers if isinstance(texts, list) else answers[0]

    def unbatch(self, answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return answers

    def encode_response(self, output: dict[str, Any]) -> dict[str, Any]:
        return output


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1, help="LitServe workers_per_device")
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--max-batch-size", type=int, default=1)
    parser.add_argument("--batch-timeout-ms", type=float, default=0.0)
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", default="fp32", help="the handler's precision setting")
    parser.add_argument(
        "--api-servers", type=int, default=1, help="HTTP processes; 0: LitServe's default"
    )
    args = parser.parse_args()
    settings = HandlerSettings(torch_threads=args.torch_threads, precision=args.precision)
    api = SentimentAPI(args.model_dir, settings, args.max_batch_size, args.batch_timeout_ms / 1000)
    server = ls.LitServer(
        api, accelerator=args.accelerator, workers_per_device=args.workers, timeout=60
    )
    server.run(
        host="127.0.0.1",
        port=args.port,
        num_api_servers=args.api_servers or None,
        generate_client_file=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
