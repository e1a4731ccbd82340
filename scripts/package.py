"""Package a Hugging Face sequence-classification folder and the handler as a .mar.

What the archive holds and how its source is recorded: ``bert_serve/harness/archive.py``.

    python scripts/package.py --model-dir build/bert-sentiment
    python scripts/package.py --model-dir build/bert-sentiment --stamp-only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bert_serve.harness.archive import (
    MODEL_CONFIG,
    check_model_dir,
    package,
    source_record,
    stamp_for,
    update_stamp,
)
from bert_serve.harness.config import MODEL_NAME, ROOT


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", type=Path, required=True, help="Hugging Face sequence-classification folder"
    )
    parser.add_argument("--export-path", type=Path, default=ROOT / "model_store")
    parser.add_argument(
        "--model-config", type=Path, default=MODEL_CONFIG, help="the handler config to pack"
    )
    parser.add_argument(
        "--stamp-only",
        action="store_true",
        help="only refresh the archive's .source stamp (rewritten when the source changed)",
    )
    args = parser.parse_args()
    model_dir, model_config = args.model_dir.resolve(), args.model_config.resolve()
    if args.stamp_only:
        check_model_dir(model_dir)
        stamp = stamp_for(args.export_path.resolve() / f"{MODEL_NAME}.mar")
        if update_stamp(stamp, source_record(model_dir, model_config)):
            print(f"{stamp.name}: the model folder or handler config changed; repackaging")
        return 0
    archive = package(model_dir, args.export_path.resolve(), model_config)
    print(f"packaged {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
