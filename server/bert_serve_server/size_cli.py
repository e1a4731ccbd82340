"""``python -m bert_serve_server size``: the image's sizing step, and a plan for a fleet.

    size --out FILE [--plan-out PLAN] [--plan PLAN] -- TORCHSERVE_ARGS

Reads the config TorchServe's own arguments name (the last ``--ts-config``; ``--model-store``
in place of the config's ``model_store``, as TorchServe takes it), sizes it
(``bert_serve_server.sizing``, with what ``BERT_SERVE_*`` variables state), writes it to
``--out`` and prints the torch threads per worker; the reasons go to stderr. ``--plan-out``
also writes the plan (``bert_serve_server.plan``); ``--plan`` (or ``BERT_SERVE_PLAN``) uses one.

``TS_CONFIG_FILE`` is refused: TorchServe reads it in place of any ``--ts-config``, so the
sized config would not be the one that runs. A config that cannot be sized, or a stated value
that cannot run, ends with one line saying why (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from bert_serve_server.config import TS_CONFIG_ENV, properties_text, read_properties
from bert_serve_server.plan import PlanError, plan_of
from bert_serve_server.rules import StatedError, gc_flag_in, heap_mib_in
from bert_serve_server.served import SizingError, served_list
from bert_serve_server.sizing import INFERENCE_ADDRESS_ENV, Resolved, report, resolve
from bert_serve_server.stated import StatedValueError, read_stated


class UsageError(ValueError):
    pass


def torchserve_config(args: list[str], environ: dict[str, str]) -> dict[str, str]:
    """The config TorchServe would run with ``args``: the last ``--ts-config``, with
    ``--model-store`` over its ``model_store``."""
    if environ.get(TS_CONFIG_ENV):
        raise UsageError(
            f"{TS_CONFIG_ENV}={environ[TS_CONFIG_ENV]} is set: TorchServe reads it in place of "
            "the sized --ts-config, so the sizing would not be what runs; unset it and pass "
            "the config as --ts-config"
        )
    torchserve = argparse.ArgumentParser(add_help=False)
    torchserve.add_argument("--ts-config", type=Path, action="append")
    torchserve.add_argument("--model-store", type=Path)
    given = args[1:] if args[:1] == ["--"] else args
    known = torchserve.parse_known_args(given)[0]
    if not known.ts_config:
        raise UsageError("no --ts-config among TorchServe's arguments: name the config to size")
    config = known.ts_config[-1]
    if not config.is_file():
        raise UsageError(f"--ts-config {config}: no such file")
    properties = read_properties(config)
    if known.model_store is not None:
        properties["model_store"] = str(known.model_store)
    return properties


def archive_bytes(properties: dict[str, str]) -> dict[str, int]:
    return {m.key: m.mar.stat().st_size for m in served_list(properties) if m.mar.is_file()}


def write_plan(path: Path, resolved: Resolved, source: dict[str, str]) -> None:
    vmargs = resolved.properties.get("vmargs", "")
    plan = plan_of(report(resolved), heap_mib_in(vmargs), archive_bytes(source), gc_flag_in(vmargs))
    path.write_text(json.dumps(plan, indent=2) + "\n")


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server size", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the sized config.properties")
    parser.add_argument("--plan-out", type=Path, help="also write the plan (what was chosen, why)")
    parser.add_argument("--plan", type=Path, help="use this plan as stated (BERT_SERVE_PLAN)")
    parser.add_argument("torchserve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        source = torchserve_config(args.torchserve_args, environ)
        stated = read_stated(environ)
        if args.plan is not None:
            stated = replace(stated, plan=args.plan)
        resolved = resolve(source, stated=stated)
    except (UsageError, SizingError, StatedError, StatedValueError, PlanError) as error:
        print(f"sizing: {error}", file=sys.stderr)
        return 1
    address = environ.get(INFERENCE_ADDRESS_ENV)
    if address:
        resolved = replace(
            resolved, properties=resolved.properties | {"inference_address": address}
        )
    for key, why in resolved.refused.items():
        print(f"sizing: model {key} refused: {why}", file=sys.stderr)
    if not json.loads(resolved.properties["models"]):
        print("sizing: no model left to serve", file=sys.stderr)
        return 1
    args.out.write_text(properties_text(resolved.properties))
    if args.plan_out is not None:
        write_plan(args.plan_out, resolved, source)
    for reason in resolved.reasons:
        print(f"sizing: {reason}", file=sys.stderr)
    print(resolved.torch_threads)
    return 0
