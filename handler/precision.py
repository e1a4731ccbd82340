"""The precision of the forward pass: which one this hardware can run natively (else the
worker fails at start, rather than serve slowly), and how: weights cast on the CPU (faster than
autocast there: docs/bench/README.md), autocast on CUDA; the logits leave as float32 either way."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
X86_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
ARM_BF16_FLAGS = frozenset({"bf16"})


@dataclass(frozen=True)
class Hardware:
    """What the worker's device can compute natively; injected in tests."""

    device_type: str
    native_bf16: bool


@dataclass(frozen=True)
class Plan:
    """How a precision is applied on a device: weights cast, or autocast around the forward."""

    weights: torch.dtype
    autocast: torch.dtype | None


def check_precision(precision: str, hardware: Hardware) -> None:
    """Raise ``ValueError`` with the reason when ``hardware`` cannot run ``precision``."""
    if precision == "fp16" and hardware.device_type != "cuda":
        raise ValueError(
            "precision fp16 needs a CUDA GPU, and this worker runs on the CPU; "
            "use bf16 on a CPU with native bf16, or fp32"
        )
    if precision == "bf16" and not hardware.native_bf16:
        where = (
            "this GPU does not support bf16"
            if hardware.device_type == "cuda"
            else "this CPU has no native bf16 (AVX-512 BF16, AMX or Arm BF16); "
            "PyTorch would emulate it, slower than fp32"
        )
        raise ValueError(f"precision bf16 cannot run here: {where}; use fp32")


def plan_for(precision: str, device_type: str) -> Plan:
    """CPU: weights in the precision, no autocast. CUDA: fp32 weights under autocast."""
    dtype = DTYPES[precision]
    if precision == "fp32":
        return Plan(weights=torch.float32, autocast=None)
    if device_type == "cuda":
        return Plan(weights=torch.float32, autocast=dtype)
    return Plan(weights=dtype, autocast=None)


def cpu_flags_have_bf16(cpuinfo: str, machine: str) -> bool:
    """Native bf16 from /proc/cpuinfo's ``flags`` (x86) or ``Features`` (Arm) lines."""
    wanted = ARM_BF16_FLAGS if machine.lower() in {"aarch64", "arm64"} else X86_BF16_FLAGS
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in {"flags", "Features"} and wanted & set(value.split()):
            return True
    return False


def cpu_has_native_bf16() -> bool:
    """torch's own CPU probes when it has them, else the kernel's CPU flags (not mkldnn's bf16
    check: it also answers yes for AVX-512 CPUs without bf16 instructions)."""
    probes = [
        getattr(torch.cpu, name, None)
        for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    if platform.machine().lower() in {"x86_64", "amd64"} and all(probes):
        return any(probe() for probe in probes if probe is not None)
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return False
    return cpu_flags_have_bf16(cpuinfo.read_text(errors="replace"), platform.machine())


def hardware_of(device: torch.device) -> Hardware:
    """The facts ``check_precision`` needs, probed on this machine for ``device``."""
    if device.type == "cuda":
        return Hardware("cuda", native_bf16=torch.cuda.is_bf16_supported(including_emulation=False))
    return Hardware("cpu", native_bf16=cpu_has_native_bf16())
