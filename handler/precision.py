"""The precision of the forward pass: which one this hardware can run natively (else the
worker fails at start, rather than serve slowly), and how: weights cast, on the CPU and on CUDA
alike (faster than autocast on both: docs/bench/README.md); the logits leave as float32.

fp32 is IEEE fp32 on every device. Importing TorchServe's ``BaseHandler`` turns TF32 on for
every Ampere or newer GPU (``torch.set_float32_matmul_precision("high")``), so the worker sets
the float32 matmul precision itself at start, after that import: TF32 only for ``tf32``.

``auto`` (the default) is settled by the project's start, once per archive, before any worker
starts (``choose_precision``, run by ``bert_serve_server.probe``): the fastest precision the
device runs natively (a GPU: bf16, else fp16; a CPU with native bf16: bf16 where it measures
faster), kept only where the model's answers hold against fp32's (``agreement``), else
fp32, with the reason. The start hands its choices to the workers in ``CHOSEN_ENV``, as it hands
them their threads in ``OMP_NUM_THREADS``: TorchServe 0.12 has no way to change a model's
config at start. A worker that finds no choice for its model (a plain ``torchserve --start``)
serves fp32 and says so in its log."""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handler.values import Prediction

DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
AUTO = "auto"
CHOSEN_ENV = "BERT_SERVE_PRECISION_CHOSEN"
"""The start's choice for each model configured ``auto``: ``NAME:VERSION=PRECISION``, by commas."""
AGREEMENT = 0.99
"""The least share of texts whose decision (top label, or a multi-label model's labels) a reduced
precision must leave as fp32 gives it."""
SCORE_TOLERANCE = 0.1
"""The largest change of a score a reduced precision may make: of a probability; of a logit or
a regression's value, this share of the largest fp32 value (at least 1)."""
CPU_SPEEDUP = 1.1
"""bf16 on a CPU is kept only where the start measures it at least this much faster than fp32,
alone and in a batch: below that, a score's move is not worth it."""
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


def reduced_candidate(hardware: Hardware) -> tuple[str | None, str]:
    """The fastest precision ``hardware`` runs natively, and why; None where that is fp32."""
    if hardware.device_type == "cuda":
        if hardware.native_bf16:
            return "bf16", "this GPU runs bf16 natively"
        return "fp16", "this GPU has no native bf16"
    if hardware.native_bf16:
        return "bf16", "this CPU has native bf16"
    return None, "this CPU has no native bf16 (AVX-512 BF16, AMX or Arm BF16)"


def decision(prediction: Prediction) -> tuple[str, ...]:
    """What a client acts on: the best label, or a multi-label model's given labels."""
    return tuple(prediction.labels) if prediction.labels is not None else (prediction.label,)


def largest_change(exact: Prediction, fast: Prediction) -> float:
    return max(abs(exact.scores[label] - fast.scores[label]) for label in exact.scores)


@dataclass(frozen=True)
class Agreement:
    """A reduced precision's answers against fp32's on the same texts."""

    texts: int
    kept: int
    """Texts whose decision is fp32's."""
    moved: float
    """The largest change of a score."""
    tolerance: float
    """``SCORE_TOLERANCE`` on these scores' scale."""
    finite: bool

    def problem(self) -> str | None:
        """Why the answers do not hold (None where they do): a score not finite, the decision
        changed on more than ``1 - AGREEMENT`` of the texts, a score moved past the tolerance."""
        if not self.texts:
            return "there were no texts to check them on"
        if not self.finite:
            return "a score is not finite"
        if self.kept < AGREEMENT * self.texts:
            return f"the decision changed on {self.texts - self.kept} of {self.texts} texts"
        if self.moved > self.tolerance:
            return f"a score moved by {self.moved:.3g}, more than {self.tolerance:.3g}"
        return None

    def __str__(self) -> str:
        return (
            f"decision kept on {self.kept} of {self.texts} texts, largest score change "
            f"{self.moved:.3g} (at most {self.tolerance:.3g})"
        )


def agreement(exact: Sequence[Prediction], fast: Sequence[Prediction]) -> Agreement:
    """How ``fast``'s answers hold against ``exact``'s (fp32's) on the same texts."""
    pairs = list(zip(exact, fast, strict=True))
    values = [value for e in exact for value in e.scores.values()]
    probabilities = all(0.0 <= value <= 1.0 for value in values)
    scale = 1.0 if probabilities else max([1.0, *map(abs, values)])
    return Agreement(
        texts=len(pairs),
        kept=sum(decision(e) == decision(f) for e, f in pairs),
        moved=max([0.0, *(largest_change(e, f) for e, f in pairs)]),
        tolerance=SCORE_TOLERANCE * scale,
        finite=all(math.isfinite(value) for f in fast for value in f.scores.values()),
    )


@dataclass(frozen=True)
class Choice:
    precision: str
    why: str


def choose_precision(
    hardware: Hardware,
    load: Callable[[str], Any],
    answers: Callable[[Any], list[Prediction]],
    speedup: Callable[[Any, Any], float],
) -> Choice:
    """``auto`` settled on ``hardware``: ``load(precision)`` loads the model, ``answers`` gives
    its predictions on the texts the choice is checked on, ``speedup(fast, exact)`` the reduced
    precision's texts/s over fp32's (measured on a CPU only: a GPU's tensor cores are why it has
    them)."""
    candidate, why = reduced_candidate(hardware)
    if candidate is None:
        return Choice("fp32", f"fp32: {why}")
    exact_model = load("fp32")
    exact = answers(exact_model)
    fast_model = load(candidate)
    held = agreement(exact, answers(fast_model))
    problem = held.problem()
    if problem is not None:
        return Choice("fp32", f"fp32: {why}, but in {candidate} {problem} ({held})")
    kept = f"{held}"
    if hardware.device_type != "cpu":
        return Choice(candidate, f"{candidate}: {why}; {kept}")
    ratio = speedup(fast_model, exact_model)
    if ratio < CPU_SPEEDUP:
        return Choice(
            "fp32", f"fp32: {why}, but it ran {ratio:.2f}x fp32's texts/s, under {CPU_SPEEDUP}x"
        )
    return Choice(candidate, f"{candidate}: {why}, {ratio:.2f}x fp32's texts/s; {kept}")


def chosen_for(key: str, environ: Mapping[str, str]) -> str | None:
    """The start's choice for the model ``NAME:VERSION`` from ``CHOSEN_ENV``, if it made one."""
    for item in environ.get(CHOSEN_ENV, "").split(","):
        name, _, precision = item.strip().rpartition("=")
        if name == key and precision in DTYPES:
            return precision
    return None


def chosen_text(choices: Mapping[str, str]) -> str:
    """``CHOSEN_ENV``'s value for ``NAME:VERSION`` -> precision."""
    return ",".join(f"{key}={precision}" for key, precision in sorted(choices.items()))
