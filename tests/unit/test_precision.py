"""Precision of the forward pass: what the hardware can run decides, before any model loads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from handler.inference import classify
from handler.model import load_model
from handler.precision import (
    AUTO,
    DTYPES,
    Hardware,
    check_precision,
    choose_attention_kernels,
    cpu_flags_have_bf16,
    cpu_has_native_bf16,
    set_matmul_precision,
)
from handler.settings import PRECISION_CHOICES, HandlerSettings
from tests.heads import HEADS

CPU_WITH_BF16 = Hardware("cpu", native_bf16=True)
CPU_WITHOUT_BF16 = Hardware("cpu", native_bf16=False)
GPU_WITH_BF16 = Hardware("cuda", native_bf16=True)
GPU_WITHOUT_BF16 = Hardware("cuda", native_bf16=False)
AMPERE = Hardware("cuda", native_bf16=True, tf32=True)


@pytest.mark.parametrize(
    ("precision", "hardware"),
    [
        ("fp32", CPU_WITHOUT_BF16),
        ("fp32", GPU_WITHOUT_BF16),
        ("bf16", CPU_WITH_BF16),
        ("bf16", GPU_WITH_BF16),
        ("fp16", GPU_WITHOUT_BF16),
        ("fp16", GPU_WITH_BF16),
        ("tf32", AMPERE),
    ],
)
def test_precisions_the_hardware_runs_are_accepted(precision: str, hardware: Hardware) -> None:
    check_precision(precision, hardware)


@pytest.mark.parametrize(
    ("precision", "hardware", "reason"),
    [
        ("bf16", CPU_WITHOUT_BF16, "this CPU has no native bf16"),
        ("bf16", GPU_WITHOUT_BF16, "this GPU does not support bf16"),
        ("fp16", CPU_WITH_BF16, "fp16 needs a CUDA GPU"),
        ("fp16", CPU_WITHOUT_BF16, "fp16 needs a CUDA GPU"),
        ("tf32", CPU_WITH_BF16, "tf32 needs a CUDA GPU .* runs on the CPU"),
        ("tf32", GPU_WITH_BF16, "tf32 needs .* older than Ampere"),
    ],
)
def test_precisions_the_hardware_cannot_run_fail_with_the_reason(
    precision: str, hardware: Hardware, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        check_precision(precision, hardware)


def test_every_precision_the_settings_accept_has_a_dtype() -> None:
    """The settings are the one place that checks a precision's name (an unknown one is
    refused there, see test_settings); every name they accept must have a dtype here."""
    assert set(DTYPES) | {AUTO} == set(PRECISION_CHOICES)


@pytest.mark.parametrize(
    ("device_type", "weights", "cudnn_attention"),
    [
        ("cuda", torch.bfloat16, False),
        ("cuda", torch.float16, False),
        ("cuda", torch.float32, True),
        ("cpu", torch.bfloat16, True),
    ],
)
def test_cudnn_attention_is_left_out_for_half_precision_on_cuda(
    device_type: str, weights: torch.dtype, cudnn_attention: bool
) -> None:
    """A process-wide switch, so it is set back after each case."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        choose_attention_kernels(device_type, weights)
        assert torch.backends.cuda.cudnn_sdp_enabled() is cudnn_attention
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


@pytest.mark.parametrize(
    ("cpuinfo", "machine", "expected"),
    [
        ("flags\t\t: fpu sse avx512f avx512_bf16 avx512_vnni\n", "x86_64", True),
        ("flags\t\t: fpu sse avx512f amx_tile amx_bf16\n", "x86_64", True),
        # AVX-512 alone: oneDNN would emulate bf16, slower than fp32.
        ("flags\t\t: fpu sse avx512f avx512bw avx512vl avx512dq\n", "x86_64", False),
        ("flags\t\t: fpu sse avx2\n", "x86_64", False),
        ("Features\t: fp asimd bf16 i8mm\n", "aarch64", True),
        ("Features\t: fp asimd\n", "aarch64", False),
        ("", "x86_64", False),
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(cpuinfo: str, machine: str, expected: bool) -> None:
    assert cpu_flags_have_bf16(cpuinfo, machine) is expected


def test_bf16_on_this_machine_loads_or_fails_at_start(tiny_model_dir: Path) -> None:
    """Either way is decided at load: bf16 weights where the CPU has bf16, else the reason."""
    settings = HandlerSettings(precision="bf16", device="cpu")
    if not cpu_has_native_bf16():
        with pytest.raises(ValueError, match="no native bf16"):
            load_model(tiny_model_dir, settings, None)
        return
    loaded = load_model(tiny_model_dir, settings, None)
    assert {parameter.dtype for parameter in loaded.model.parameters()} == {torch.bfloat16}


def test_fp16_on_the_cpu_fails_at_start(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="fp16 needs a CUDA GPU"):
        load_model(tiny_model_dir, HandlerSettings(precision="fp16", device="cpu"), None)


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
@pytest.mark.parametrize("kind", sorted(HEADS))
def test_bf16_scores_every_head_in_float32_close_to_fp32(
    head_model_dir: Callable[..., Path], kind: str
) -> None:
    """Scores leave the forward as float32 and score the same way; bf16 moves them a little."""
    model_dir = head_model_dir(kind)
    texts = ["short", "a somewhat longer sentence to classify", "word " * 50]
    exact, _ = classify(load_model(model_dir, HandlerSettings(), None), texts, 128, 256)
    fast, _ = classify(
        load_model(model_dir, HandlerSettings(precision="bf16"), None), texts, 128, 256
    )
    for got, expected in zip(fast, exact, strict=True):
        assert got.scores.keys() == expected.scores.keys()
        assert all(isinstance(score, float) for score in got.scores.values())
        assert got.scores == pytest.approx(expected.scores, abs=0.1)


def tensor_cores_on() -> None:
    """What importing TorchServe's BaseHandler does on an Ampere or newer GPU."""
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def matmul_state() -> tuple[str, bool, bool]:
    return (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )


@pytest.fixture
def restore_matmul_precision() -> Iterator[None]:
    """The switches are process-wide: each test leaves them as it found them."""
    before = matmul_state()
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cuda.matmul.allow_tf32 = before[1]
    torch.backends.cudnn.allow_tf32 = before[2]


@pytest.mark.usefixtures("restore_matmul_precision")
@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        ("fp32", ("highest", False, False)),
        ("bf16", ("highest", False, False)),
        ("fp16", ("highest", False, False)),
        ("tf32", ("high", True, True)),
    ],
)
def test_matmul_precision_follows_the_configured_precision(
    precision: str, expected: tuple[str, bool, bool]
) -> None:
    """Whatever an import set before, TF32 is on for tf32 only."""
    tensor_cores_on()
    set_matmul_precision(precision)
    assert matmul_state() == expected
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    set_matmul_precision(precision)
    assert matmul_state() == expected


@pytest.mark.usefixtures("restore_matmul_precision")
def test_worker_start_undoes_torchserve_tensor_cores_for_fp32(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """TorchServe's import sets "high" on Ampere+ GPUs before the handler runs; a worker
    configured fp32 starts with IEEE matmuls and TF32 off."""
    from tests.worker_harness import build_worker

    tensor_cores_on()
    build_worker(tmp_path, tiny_model_dir, {"precision": "fp32", "device": "cpu"})
    assert matmul_state() == ("highest", False, False)


def test_tf32_on_the_cpu_fails_at_worker_start(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tests.worker_harness import build_worker

    with pytest.raises(Exception, match="tf32 needs a CUDA GPU"):
        build_worker(tmp_path, tiny_model_dir, {"precision": "tf32", "device": "cpu"})


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < (8, 0),
    reason="needs a CUDA GPU of compute capability 8.0 or more",
)
@pytest.mark.usefixtures("restore_matmul_precision")
def test_fp32_on_an_ampere_gpu_matches_the_cpu_within_1e_5(tiny_model_dir: Path) -> None:
    """With TorchServe's import having turned TF32 on, fp32 on the GPU stays IEEE fp32."""
    tensor_cores_on()
    texts = ["short", "a somewhat longer sentence to classify", "word " * 50]
    on_cpu, _ = classify(
        load_model(tiny_model_dir, HandlerSettings(device="cpu"), None), texts, 128, 256
    )
    on_gpu, _ = classify(load_model(tiny_model_dir, HandlerSettings(), 0), texts, 128, 256)
    for got, expected in zip(on_gpu, on_cpu, strict=True):
        assert got.scores == pytest.approx(expected.scores, abs=1e-5)
