"""The facts every benchmark report records: ratios are only compared within one machine."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

CPUINFO = Path("/proc/cpuinfo")
WATCHED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
"""The instruction sets that change torch's CPU speed: AVX2, AVX-512, native bf16, AMX."""


def cpu_model_and_flags() -> tuple[str, list[str]]:
    model, flags = platform.processor() or "unknown", set()
    if CPUINFO.is_file():
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return model, [flag for flag in WATCHED_FLAGS if flag in flags]


def describe() -> dict[str, Any]:
    model, flags = cpu_model_and_flags()
    return {
        "cpu_model": model,
        "cpu_flags": flags,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
