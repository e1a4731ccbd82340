"""Packaging a Hugging Face sequence-classification folder and the handler as a .mar.

The archive holds ``bert_handler.py`` (TorchServe's entry point), the ``handler`` package
itself (the same files the unit tests import) under ``handler/``, the model under
``model/`` (config, safetensors weights, tokenizer: never pickled weights),
``config/model-config.yaml`` as the model config, with ``--reference`` the reference profile
(``reference-profile.json``, ``reference_profile``) and the texts themselves
(``reference-texts.txt``: what ``precision: auto`` checks a reduced precision's answers on), and ``mar-source.json``: which model
folder (each file's size and modification time) and which handler config (its sha256) it
was built from. The same record is kept beside the archive as ``bert.mar.source``, a stamp
the Makefile refreshes with ``--stamp-only`` and that is rewritten only when the record
changes, so ``make serve MODEL_DIR=X`` repackages whenever X is not what the .mar holds,
even when X's files are older than the .mar.

``python -m bert_serve_server package`` (``make package``, ``USAGE``) is the command; the tuner and
the tests call ``package`` and ``package_variant``, a start with ``--models`` ``package_models``.

The reference profile an archive carries: what the model says on texts the user gives,
computed when the archive is packaged, in the terms of the handler's model metrics
(``handler.model_metrics``), so live and reference can be put side by side in PromQL. The texts
file holds one text a line (blank lines skipped); a line with a tab is a text pair, tokenized as
the pair route does. The model runs as the handler config packed beside it says (precision,
max_length, labels, score function), on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bert_serve_server.config import (
    MODEL_NAME,
    MODEL_VERSION,
    NAME_PATTERN,
    ROOT,
    ModelSpec,
    archive_name,
    serving_overrides,
)
from bert_serve_server.probe import REFERENCE_TEXTS

DEFAULT_MODEL_DIR = ROOT / "build" / "bert-sentiment"
DEFAULT_ARCHIVE = ROOT / "model_store" / f"{MODEL_NAME}.mar"
"""``make package``'s archive of the default model."""
DEFAULT_REFERENCE = ROOT / "build" / "reference-reviews.txt"
"""The default model's reference texts, its held-out reviews (``python -m training reference``)."""
HANDLER_DIR = ROOT / "handler"
MODEL_CONFIG = ROOT / "config" / "model-config.yaml"
PER_MODEL_CONFIG_DIR = ROOT / "config" / "models"
PICKLED_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".h5", ".msgpack"}
BATCH_KEYS = ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers")
"""TorchServe's batching and worker keys: config.properties' ``models=``, never the .mar's yaml."""
SOURCE_FILE = "mar-source.json"
STAMP_SUFFIX = ".source"
VARIANT_CONFIG_SUFFIX = ".model-config.yaml"


def check_model_dir(model_dir: Path, model_config: Path = MODEL_CONFIG) -> None:
    """Refuse, with every reason and its fix, a folder the worker would refuse at start: the
    same check (``handler.model_check``) for the handler settings packed beside it."""
    from handler.model_check import inspect_folder
    from handler.settings import HandlerSettings

    document = yaml.safe_load(model_config.read_text()) or {}
    try:
        settings = HandlerSettings.from_mapping(document.get("handler"))
    except ValueError as error:
        raise SystemExit(f"{model_config}: {error}") from None
    problems = inspect_folder(model_dir, settings).problems
    if problems:
        lines = "".join(f"\n  - {problem.reason}\n    fix: {problem.fix}" for problem in problems)
        raise SystemExit(f"{model_dir} cannot be served:{lines}")


def default_reference(model_dir: Path) -> Path | None:
    """The reference ``make package`` packs for ``model_dir``: the default model's held-out
    reviews once written, none for any other folder."""
    if model_dir.resolve() == DEFAULT_MODEL_DIR.resolve() and DEFAULT_REFERENCE.is_file():
        return DEFAULT_REFERENCE
    return None


def check_model_config(path: Path) -> None:
    """Batch settings live in config.properties only; a copy here would silently win."""
    document = yaml.safe_load(path.read_text()) or {}
    duplicated = sorted(set(BATCH_KEYS) & set(document))
    if duplicated:
        raise SystemExit(
            f"{path}: {duplicated} belong in config/config.properties, not the model config"
        )


def packaged_files(model_dir: Path) -> list[Path]:
    return [
        item
        for item in sorted(model_dir.iterdir())
        if item.is_file() and item.suffix not in PICKLED_SUFFIXES
    ]


def source_record(
    model_dir: Path,
    model_config: Path = MODEL_CONFIG,
    name: str = MODEL_NAME,
    version: str = MODEL_VERSION,
    reference: Path | None = None,
) -> str:
    """What an archive is built from, as stable JSON text: the model folder with each packaged
    file's size and modification time, the handler config with its content hash, the name
    and version it is served under, and the reference texts' hash when it has them."""
    files = {
        item.name: {"size": item.stat().st_size, "mtime_ns": item.stat().st_mtime_ns}
        for item in packaged_files(model_dir)
    }
    record = {
        "model_dir": str(model_dir.resolve()),
        "model_files": files,
        "model_config": str(model_config.resolve()),
        "model_config_sha256": hashlib.sha256(model_config.read_bytes()).hexdigest(),
        "name": name,
        "version": version,
    }
    if reference is not None:
        record["reference"] = str(reference.resolve())
        record["reference_sha256"] = hashlib.sha256(reference.read_bytes()).hexdigest()
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def stamp_for(archive: Path) -> Path:
    return archive.with_name(archive.name + STAMP_SUFFIX)


def update_stamp(stamp: Path, record: str) -> bool:
    """Write the record only when it differs, so the stamp's time says when the source last
    changed (make compares it with the archive's). True when it was rewritten."""
    if stamp.is_file() and stamp.read_text() == record:
        return False
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(record)
    return True


def checked_before(archive: Path, record: str, handler_dir: Path = HANDLER_DIR) -> bool:
    """The stamp holds ``record`` and the archive was packaged after both it and the handler's
    code (whose folder check ``--stamp-only`` runs) last changed: that folder passed this very
    check then, and checking it again only costs an import of torch and transformers."""
    stamp = stamp_for(archive)
    if not (archive.is_file() and stamp.is_file() and stamp.read_text() == record):
        return False
    built = archive.stat().st_mtime_ns
    code = [stamp, *handler_dir.glob("*.py")]
    return all(path.stat().st_mtime_ns <= built for path in code)


def stage(
    model_dir: Path,
    staging: Path,
    record: str,
    profile: str | None = None,
    reference: Path | None = None,
) -> None:
    shutil.copytree(
        HANDLER_DIR, staging / "handler", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    (staging / "model").mkdir()
    for item in packaged_files(model_dir):
        shutil.copy2(item, staging / "model" / item.name)
    (staging / SOURCE_FILE).write_text(record)
    if profile is not None:
        from handler.metrics import PROFILE_FILE

        (staging / PROFILE_FILE).write_text(profile)
    if reference is not None:  # what ``precision: auto`` checks a reduced precision on
        shutil.copyfile(reference, staging / REFERENCE_TEXTS)


def archiver_command() -> str:
    """The archiver installed beside this Python, so a venv works without being activated."""
    return (
        shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent))
        or "torch-model-archiver"
    )


def run_archiver(
    handler: Path,
    archive: Path,
    *options: str,
    name: str = MODEL_NAME,
    version: str = MODEL_VERSION,
) -> None:
    """torch-model-archiver: ``archive`` (a .mar of model ``name`` and ``version``) with
    ``handler`` and ``options``, staged in a TMPDIR of its own (it empties
    ``$TMPDIR/<model name>`` first, so two packagings at once on one machine would otherwise
    mix or delete each other's files), then moved to its file name (the archiver names the file
    after the model; two versions of one model need two files)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="archiver-") as temp:
        subprocess.run(
            [
                archiver_command(),
                "--model-name",
                name,
                "--version",
                version,
                "--handler",
                str(handler),
                *options,
                "--export-path",
                temp,
                "--force",
            ],
            check=True,
            env=os.environ | {"TMPDIR": temp},
        )
        shutil.move(Path(temp) / f"{name}.mar", archive)


def package(
    model_dir: Path,
    export_path: Path,
    model_config: Path = MODEL_CONFIG,
    name: str = MODEL_NAME,
    version: str = MODEL_VERSION,
    file_name: str | None = None,
    checked: bool = False,
    reference: Path | None = None,
) -> Path:
    """Build ``export_path/NAME.mar`` (or ``file_name``) of model ``name`` and ``version``.
    Its stamp is refreshed first: a failed build then leaves a stamp newer than the old
    archive, so make tries again. ``checked``: the folder was just checked with this config
    (make runs ``--stamp-only`` first), so the check, which imports torch and transformers, is
    not run twice. The entries are stored, not deflated (the archiver's ``zip-store``):
    deflating the safetensors weights saves 8 % of their size and took most of the archiver's
    time. ``reference``: texts to profile the model on (``reference_profile``)."""
    if not checked:
        check_model_dir(model_dir, model_config)
    check_model_config(model_config)
    export_path.mkdir(parents=True, exist_ok=True)
    archive = export_path / (file_name or f"{name}.mar")
    record = source_record(model_dir, model_config, name, version, reference)
    update_stamp(stamp_for(archive), record)
    profile = None
    if reference is not None:
        profile = reference_profile(model_dir, model_config, reference)
    with tempfile.TemporaryDirectory(prefix="bert-mar-") as temp:
        staging = Path(temp) / "extra"
        staging.mkdir()
        stage(model_dir, staging, record, profile, reference)
        run_archiver(
            HANDLER_DIR / "bert_handler.py",
            archive,
            "--extra-files",
            str(staging),
            "--config-file",
            str(model_config),
            "--archive-format",
            "zip-store",
            name=name,
            version=version,
        )
    return archive


def write_variant_config(
    path: Path,
    base: Path = MODEL_CONFIG,
    changes: dict[str, Any] | None = None,
    handler_changes: dict[str, Any] | None = None,
) -> Path:
    """``base`` with ``changes`` at its top level (e.g. responseTimeout) and ``handler_changes``
    in its ``handler:`` section, written to ``path`` only when its text differs, so the
    archive's source record (which hashes it) changes only when the settings do."""
    config = yaml.safe_load(base.read_text())
    config |= changes or {}
    config["handler"] = config["handler"] | (handler_changes or {})
    text = yaml.safe_dump(config)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def variant_config_for(archive: Path) -> Path:
    """Where the handler config of an archive packaged with changed settings is kept: beside
    the archive, so two stores never share one."""
    return archive.with_name(archive.name + VARIANT_CONFIG_SUFFIX)


def package_variant(
    store: Path,
    changes: dict[str, Any] | None = None,
    handler_changes: dict[str, Any] | None = None,
    model_dir: Path = DEFAULT_MODEL_DIR,
) -> Path:
    """Package ``model_dir`` into ``store`` with config/model-config.yaml changed (see
    ``write_variant_config``); unchanged, the default model is a copy of ``make package``'s
    archive where that is up to date (``fresh_default_archive``)."""
    archive = store / f"{MODEL_NAME}.mar"
    default = None if changes or handler_changes else fresh_default_archive(model_dir)
    if default is not None:
        store.mkdir(parents=True, exist_ok=True)
        shutil.copy2(default, archive)
        return archive
    config_file = write_variant_config(
        variant_config_for(archive), MODEL_CONFIG, changes, handler_changes
    )
    return package(model_dir, store, config_file)


def fresh_default_archive(model_dir: Path) -> Path | None:
    """``DEFAULT_ARCHIVE`` where ``model_dir`` is the default model and the archive is built
    from it and the shipped config as they are now (``is_stale``), else None. Its copies are
    byte for byte the same, so a start measures them once (``probe.remembered``)."""
    if model_dir.resolve() != DEFAULT_MODEL_DIR.resolve():
        return None
    model_dir, config = model_dir.resolve(), MODEL_CONFIG.resolve()
    record = source_record(
        model_dir, config, MODEL_NAME, MODEL_VERSION, default_reference(model_dir)
    )
    return None if is_stale(DEFAULT_ARCHIVE, record) else DEFAULT_ARCHIVE


PACKAGING_CODE = (Path(__file__),)
"""Besides the handler: what the Makefile's .mar rule lists as the archive's prerequisites."""


def is_stale(archive: Path, record: str) -> bool:
    """As the Makefile decides for bert.mar: missing, built from another source record, or
    older than the handler's or the packaging's code or its stamp (a build that failed)."""
    if not archive.is_file() or not stamp_for(archive).is_file():
        return True
    if stamp_for(archive).read_text() != record:
        return True
    code = [*HANDLER_DIR.glob("*.py"), *PACKAGING_CODE, stamp_for(archive)]
    return max(path.stat().st_mtime_ns for path in code) > archive.stat().st_mtime_ns


def package_if_changed(
    model_dir: Path,
    archive: Path,
    model_config: Path,
    name: str,
    version: str,
    precision: str | None = None,
) -> bool:
    """Package ``archive`` unless it is already built from this source; True if it was.
    SystemExit, with every reason, for a folder that cannot be served (``check_model_dir``).
    The default model gets its reference, as ``make package`` packs it."""
    if precision:
        model_config = write_variant_config(
            variant_config_for(archive), model_config, handler_changes={"precision": precision}
        )
    model_dir, model_config = model_dir.resolve(), model_config.resolve()
    reference = default_reference(model_dir)
    if not is_stale(archive, source_record(model_dir, model_config, name, version, reference)):
        return False
    package(
        model_dir, archive.parent, model_config, name, version, archive.name, reference=reference
    )
    return True


def handler_config_for(name: str, default: Path = MODEL_CONFIG) -> Path:
    """``config/models/NAME.yaml`` where it exists (precision, limits, deadline budget of that
    model), else ``default``."""
    own = PER_MODEL_CONFIG_DIR / f"{name}.yaml"
    return own if own.is_file() else default


def package_models(
    specs: Sequence[ModelSpec],
    store: Path,
    configured: dict[str, dict[str, dict[str, Any]]],
    model_config: Path | None = None,
    precision: str | None = None,
) -> tuple[dict[str, str] | None, dict[str, str]]:
    """Package into ``store`` each model whose source changed; the overrides that serve those
    that could be packaged with the settings ``configured`` (a config's ``models=``; None if
    none could), and why each other one is refused (``NAME:VERSION`` -> the package check's
    reasons)."""
    refused: dict[str, str] = {}
    for spec in specs:
        archive = store / archive_name(spec, specs)
        config = handler_config_for(spec.name, model_config or MODEL_CONFIG)
        if not (spec.model_dir / "config.json").is_file():
            refused[spec.key] = f"{spec.model_dir} has no config.json: not a Hugging Face folder"
            continue
        try:
            built = package_if_changed(
                spec.model_dir, archive, config, spec.name, spec.version, precision
            )
        except SystemExit as error:
            refused[spec.key] = str(error)
            continue
        print(f"{spec.key}: {archive.name} {'packaged' if built else 'unchanged'}")
    kept = [spec for spec in specs if spec.key not in refused]
    if not kept:
        return None, refused
    return serving_overrides(kept, configured) | {"model_store": str(store)}, refused


CHUNK = 64
"""Texts per forward call while profiling."""


def read_texts(path: Path) -> list[str | tuple[str, str]]:
    """One text a line; a tab makes a (text, text_pair)."""
    texts: list[str | tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        first, tab, second = line.partition("\t")
        texts.append((first, second) if tab else line)
    if not texts:
        raise SystemExit(f"{path}: no texts (one a line)")
    return texts


def reference_profile(model_dir: Path, model_config: Path, texts_file: Path) -> str:
    """The profile's JSON text (``handler.model_metrics.Profile``)."""
    from handler.inference import Windows, classify
    from handler.metrics import profile
    from handler.model import head_kind, load_model
    from handler.settings import HandlerSettings

    document = yaml.safe_load(model_config.read_text()) or {}
    settings = HandlerSettings.from_mapping(document.get("handler"))
    budget = settings.max_batch_tokens or settings.max_length * 16
    settings = dataclasses.replace(settings, device="cpu", max_batch_tokens=budget)
    loaded = load_model(model_dir, settings, None)
    # the texts' windows counted as the server will count them
    windows = Windows.of(settings) if settings.long_texts == "windows" else None
    texts = read_texts(texts_file)
    too_long = [
        t for t in texts if sum(map(len, t if isinstance(t, tuple) else (t,))) > settings.max_chars
    ]
    if too_long:
        raise SystemExit(
            f"{texts_file}: {len(too_long)} texts have more than max_chars "
            f"({settings.max_chars}) characters, which the server refuses; shorten or drop them"
        )
    predictions, tokens = [], []
    for start in range(0, len(texts), CHUNK):
        chunk = texts[start : start + CHUNK]
        found, stats = classify(loaded, chunk, settings.max_length, budget, windows)
        predictions += found
        tokens += stats.text_tokens
    return profile(predictions, tokens, head_kind(loaded), loaded.labels).to_json()


USAGE = """Package a Hugging Face sequence-classification folder and the handler as a .mar.

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


def main(argv: list[str] | None = None) -> int:
    # Packing copies the handler from the checkout: without it (the image) say so, not a trace.
    try:
        from handler.settings import PRECISION_CHOICES
    except ModuleNotFoundError as error:
        print(f"error: package needs the checkout's handler/ ({error})", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server package",
        description=USAGE,
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
