"""Package a Hugging Face sequence-classification folder and the handler as a .mar.

What the archive holds and how its source is recorded: ``bert_serve_server.archive``.

    python -m bert_serve_server package --model-dir build/bert-sentiment
    python -m bert_serve_server package --model-dir build/bert-sentiment --stamp-only
    python -m bert_serve_server package --model-dir build/bert-sentiment --precision bf16
    python -m bert_serve_server package --model-dir build/toxicity --name toxicity --version 2
    python -m bert_serve_server package --model-dir build/toxicity --reference texts.txt

The folder is checked first with the worker's own check (``handler/model_check.py``): one
that cannot be served is refused in seconds, every reason printed with its fix, exit 1.

``--precision`` packs the handler config with ``handler.precision`` replaced (kept beside the
archive as ``NAME.mar.model-config.yaml``), so ``make serve PRECISION=bf16`` serves the fast
mode and ``make serve`` without it repackages the config as written.

``--reference FILE`` (one text a line) profiles the model on those texts and packs the profile,
which the workers export as ``Reference*`` gauges for the drift rules (docs/operating/README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bert_serve_server.archive import (
    MODEL_CONFIG,
    check_model_dir,
    checked_before,
    package,
    source_record,
    stamp_for,
    update_stamp,
    variant_config_for,
    write_variant_config,
)
from bert_serve_server.config import MODEL_NAME, MODEL_VERSION, ROOT
from bert_serve_server.models import NAME_PATTERN


def main(argv: list[str] | None = None) -> int:
    # Packing copies the handler from the checkout: without it (the image) say so, not a trace.
    try:
        from handler.settings import PRECISION_CHOICES
    except ModuleNotFoundError as error:
        print(f"error: package needs the checkout's handler/ ({error})", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server package",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model-dir", type=Path, required=True, help="Hugging Face sequence-classification folder"
    )
    parser.add_argument("--export-path", type=Path, default=ROOT / "model_store")
    parser.add_argument(
        "--model-config", type=Path, default=MODEL_CONFIG, help="the handler config to pack"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        help="pack the handler config with this precision (default: as the config says)",
    )
    parser.add_argument(
        "--name",
        default=MODEL_NAME,
        help="the model's name: model_store/NAME.mar, /predictions/NAME",
    )
    parser.add_argument("--version", default=MODEL_VERSION, help="the model's version")
    parser.add_argument(
        "--reference",
        type=Path,
        help="texts like the ones the model should see, one a line: their profile is packed",
    )
    parser.add_argument(
        "--checked",
        action="store_true",
        help="skip the folder check: --stamp-only has just checked these arguments (make does)",
    )
    parser.add_argument(
        "--stamp-only",
        action="store_true",
        help="only check the folder and refresh the archive's .source stamp (rewritten when "
        "the source changed); an unchanged source the archive was packaged from since the "
        "handler's code last changed is not checked again",
    )
    args = parser.parse_args(argv)
    for what in ("name", "version"):
        if not NAME_PATTERN.fullmatch(getattr(args, what)):
            parser.error(f"--{what} must be letters, digits, '_', '-' or '.'")
    model_dir, model_config = args.model_dir.resolve(), args.model_config.resolve()
    reference = args.reference.resolve() if args.reference else None
    if reference is not None and not reference.is_file():
        parser.error(f"--reference {args.reference}: no such file")
    archive = args.export_path.resolve() / f"{args.name}.mar"
    if args.precision:
        model_config = write_variant_config(
            variant_config_for(archive), model_config, handler_changes={"precision": args.precision}
        )
    if args.stamp_only:
        record = source_record(model_dir, model_config, args.name, args.version, reference)
        if checked_before(archive, record):
            return 0
        check_model_dir(model_dir, model_config)
        stamp = stamp_for(archive)
        if update_stamp(stamp, record):
            print(f"{stamp.name}: the model folder or handler config changed; repackaging")
        return 0
    archive = package(
        model_dir,
        args.export_path.resolve(),
        model_config,
        args.name,
        args.version,
        checked=args.checked,
        reference=reference,
    )
    print(f"packaged {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    return 0
