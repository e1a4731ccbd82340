"""The reference peer for the benchmark: a minimal LitServe server of the same model.

What a team would write instead of bert-serve: one LitAPI, no batching, the same model
folder and the same tokenization and forward code. Installed with the ``bench`` extra.

    python scripts/litserve_peer.py --model-dir build/bert-sentiment --port 8100
"""

import argparse
from pathlib import Path
from typing import Any

import litserve as ls

from handler.inference import classify
from handler.model import load_model
from handler.settings import HandlerSettings


class SentimentAPI(ls.LitAPI):  # type: ignore[misc]
    def __init__(self, model_dir: Path) -> None:
        super().__init__()
        self.model_dir = model_dir
        self.settings = HandlerSettings()

    def setup(self, device: str) -> None:
        self.loaded = load_model(self.model_dir, self.settings, gpu_id=None)

    def decode_request(self, request: dict) -> str:  # type: ignore[type-arg]  # LitServe reads this plain dict annotation
        return str(request["text"])

    def predict(self, text: str) -> dict[str, Any]:
        predictions, _ = classify(
            self.loaded, [text], self.settings.max_length, self.settings.max_batch_tokens
        )
        prediction = predictions[0]
        return {"label": prediction.label, "score": prediction.score, "scores": prediction.scores}

    def encode_response(self, output: dict[str, Any]) -> dict[str, Any]:
        return output


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = ls.LitServer(
        SentimentAPI(args.model_dir), accelerator="cpu", workers_per_device=1, timeout=60
    )
    server.run(
        host="127.0.0.1",
        port=args.port,
        num_api_servers=1,
        generate_client_file=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
