"""What every report shares: its command line, the machine it ran on, its JSON written
compactly, its plots."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
WATCHED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
"""The instruction sets that change torch's CPU speed: AVX2, AVX-512, native bf16, AMX."""
WIDTH = 100
RECORD_WIDTH = 600


def tool_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """``python -m lab NAME``'s parser: its module's docstring is its help, as written."""
    raw = argparse.RawDescriptionHelpFormatter
    return argparse.ArgumentParser(
        prog=f"python -m lab {name}", description=doc, formatter_class=raw
    )


def describe() -> dict[str, Any]:
    """The machine's facts: ratios are only compared within one machine."""
    import torch

    model, flags = platform.processor() or "unknown", set()
    if CPUINFO.is_file():
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return {
        "cpu_model": model,
        "cpu_flags": [flag for flag in WATCHED_FLAGS if flag in flags],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def dumps(value: Any, indent: int = 0) -> str:
    """JSON with one record a line: a value goes on one line if it fits in ``WIDTH``, holds
    no container, or holds only flat ones and fits in ``RECORD_WIDTH``."""
    line = json.dumps(value, ensure_ascii=False)
    depth = _depth(value)
    if depth <= 1 or len(line) + indent <= WIDTH or (depth == 2 and len(line) <= RECORD_WIDTH):
        return line
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [
            f"{pad}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 2)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + dumps(v, indent + 2) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(data) + "\n", encoding="utf-8")
    return path


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
