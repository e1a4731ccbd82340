"""The precision of the forward pass: which one this hardware can run natively (else the
worker fails at start, rather than serve slowly), and how: weights cast, on the CPU and on CUDA
alike (faster than autocast on both: docs/bench/README.md); the logits leave as float32.

fp32 is IEEE fp32 on every device. Importing TorchServe's ``BaseHandler`` turns TF32 on for
every Ampere or newer GPU (``torch.set_float32_matmul_precision("high")``), so the worker sets
the float32 matmul precision itself at start, after that import: TF32 only for ``tf32``."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
TF32_CAPABILITY = (8, 0)
"""CUDA compute capability from which matmuls run in TF32 (Ampere)."""
X86_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
ARM_BF16_FLAGS = frozenset({"bf16"})


@dataclass(frozen=True)
class Hardware:
    """What the worker's device can compute natively; injected in tests."""

    device_type: str
    native_bf16: bool
    tf32: bool = False
    """A CUDA device of compute capability 8.0 or more."""


def check_precision(precision: str, hardware: Hardware) -> None:
    """Raise ``ValueError`` with the reason when ``hardware`` cannot run ``precision``."""
    if precision == "tf32" and not hardware.tf32:
        where = (
            "this GPU is older than Ampere (compute capability 8.0)"
            if hardware.device_type == "cuda"
            else "this worker runs on the CPU"
        )
        raise ValueError(
            f"precision tf32 needs a CUDA GPU of compute capability 8.0 or more, and {where}; "
            "use fp32 (or bf16 where the hardware has it)"
        )
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


def choose_attention_kernels(device_type: str, weights: torch.dtype) -> None:
    """Leave cuDNN's attention out for bf16 and fp16 on CUDA: PyTorch picks it there, and it
    builds a plan for every new input shape, which batches of varying lengths keep making (on
    an H100, bf16 passes of 1 and 16 texts ran 4x and 11x slower with it: docs/bench/README.md).
    The flash and memory-efficient kernels run instead. fp32 never uses it."""
    if device_type == "cuda" and weights != torch.float32:
        torch.backends.cuda.enable_cudnn_sdp(False)


def set_matmul_precision(precision: str) -> str:
    """Set the process's float32 matmul precision from the configured ``precision`` (TF32
    for ``tf32`` only, IEEE otherwise), whatever an import set before; returns it for the log."""
    tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return (
        "float32 matmuls in TF32 (precision tf32)"
        if tf32
        else f"float32 matmuls in IEEE fp32, TF32 off (precision {precision})"
    )


def hardware_of(device: torch.device) -> Hardware:
    """The facts ``check_precision`` needs, probed on this machine for ``device``."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        capability = torch.cuda.get_device_capability(device)
        return Hardware("cuda", native_bf16=bf16, tf32=capability >= TF32_CAPABILITY)
    return Hardware("cpu", native_bf16=cpu_has_native_bf16())
