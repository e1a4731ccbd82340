"""Compare fp32 with a faster precision on your own texts: speed, score changes, label flips.

The model runs in this process through the handler's classify path with the settings of the
model config (threads per worker, max_batch_tokens), once per precision. Writes the full
comparison as JSON to --out and prints a summary.

    python scripts/compare_precision.py --model-dir build/bert-sentiment --texts my_texts.txt
    make compare-precision MODEL_DIR=path/to/model TEXTS=my_texts.txt

--texts is a UTF-8 file with one text per line (blank lines skipped); without it, the
benchmark corpus (2,000 mixed-length review texts) is used. Where CUDA is present the model
runs on the first GPU (as a worker would, unless the config says ``device: cpu``), and tf32 is
a choice: fp32 there is IEEE fp32, TF32 off.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from bert_serve_server.archive import DEFAULT_MODEL_DIR, MODEL_CONFIG

from lab.compare import compare_precision, config_settings, precision_choices, summary
from lab.corpus import make_corpus


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--texts", type=Path, help="one text per line (default: the corpus)")
    cuda = torch.cuda.is_available()
    parser.add_argument("--precision", choices=precision_choices(cuda), default="bf16")
    parser.add_argument("--model-config", type=Path, default=MODEL_CONFIG)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5, help="timed passes per precision")
    parser.add_argument("--out", type=Path, default=Path("build/compare-precision.json"))
    args = parser.parse_args()
    if args.texts:
        texts = [
            line for line in args.texts.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    else:
        texts = make_corpus()
    try:
        result = compare_precision(
            args.model_dir,
            texts,
            args.precision,
            config_settings(args.model_config),
            args.batch_size,
            args.seconds,
            gpu_id=0 if cuda else None,
        )
    except ValueError as error:
        print(f"cannot compare: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(summary(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
