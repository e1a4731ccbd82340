"""Measuring an archive's own model, in a fresh child process: one worker's texts/s at each
batch size, its memory, and on a GPU a batch's device and CPU time.

The rate is measured so that it repeats start after start: every batch size classifies the
same ``SAMPLE_COUNT`` texts (their lengths spread as reviews' are), so each size sees the same
lengths; the sizes are measured in rounds, each round going through every size once, so a
moment of contention on a shared machine falls on all sizes alike; each size's rate is the
best of its rounds (``rules.best_rates``): a round is only ever slowed by what else runs, and a
cloud VM's core runs slower for seconds at a time, so the best round is the machine's own
speed and repeats start after start more closely than the median (docs/configuration.md, "How
much the choice repeats"). A worker's memory is the child's own peak
resident set (``VmHWM``) after loading and its largest batch, with its unique and proportional
sets (USS, PSS) beside it, in a process of its own (``measure_memory``): what one more worker
costs the machine, as measured, not estimated.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_serve_server.rules import BATCH_SIZES, DeviceLoad, best_rates

ROUNDS = 5
"""Rounds of every batch size: each size's rate is the best of this many."""
SAMPLE_COUNT = 64
"""Texts each batch size classifies per round (a multiple of every candidate size)."""
MIN_ROUND_S = 0.2
"""A round of one size repeats its texts until this long (a fast GPU's clock resolution)."""
DEVICE_MEASURE_S = 0.6
SAMPLE_WORDS = (
    "the film was slow at first but the acting and the score carried it to a fine end "
    "although some scenes dragged and the plot left a few questions open for the next one"
).split()
DEFAULT_MAX_CHARS = 10_000
MANIFEST = "MAR-INF/MANIFEST.json"


class MeasureError(RuntimeError):
    """Measuring the model ``key`` failed (its own code, most likely); the cause says how."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class WorkerMemory:
    """One worker's memory as the measuring process holds it after loading its model and
    classifying its largest batch, in bytes."""

    peak_bytes: int
    """Peak resident set (``VmHWM``): what the worker's cgroup is charged at most."""
    uss_bytes: int
    """Pages this process alone maps (private)."""
    pss_bytes: int
    """Resident pages, shared ones split among the processes that map them."""


def sample_texts(count: int) -> list[str]:
    """Texts of 8 to 71 words, their lengths spread as reviews' are: the rate depends on the
    lengths and on how a batch groups them, not on the words."""
    return [
        " ".join(SAMPLE_WORDS[(i + j) % len(SAMPLE_WORDS)] for j in range(8 + i * 37 % 64))
        for i in range(count)
    ]


def archive_handler_config(mar: Path) -> dict[str, Any]:
    """The ``handler:`` section of the .mar's own model config: the file its manifest names
    (``MAR-INF/MANIFEST.json``'s ``model.configFile``, as the archiver packed it; empty where it
    names none, or where it has no manifest), which TorchServe gives its workers."""
    import yaml

    with zipfile.ZipFile(mar) as archive:
        if MANIFEST not in archive.namelist():
            return {}
        name = json.loads(archive.read(MANIFEST)).get("model", {}).get("configFile")
        if not name:
            return {}
        raw = yaml.safe_load(archive.read(name)) or {}
    return dict(raw.get("handler") or {})


def holds_a_model(mar: Path) -> bool:
    """The .mar has a Hugging Face folder (``model/config.json``) to measure."""
    with zipfile.ZipFile(mar) as archive:
        return "model/config.json" in archive.namelist()


def load_archive(mar: Path, threads: int, gpus: int, as_a_worker: bool = False) -> tuple[Any, Any]:
    """(loaded model, handler settings) of the .mar's own model, handler code and settings,
    in this process with ``threads`` torch threads (on GPU 0 where there is one); with
    ``as_a_worker``, also what a TorchServe worker imports besides (its service loop and the
    archive's whole handler), for its memory. This process must not have imported ``handler``
    yet: ``in_fresh_process`` runs it in a fresh one."""
    import torch

    with tempfile.TemporaryDirectory(prefix="bert-serve-sizing-") as unpacked:
        with zipfile.ZipFile(mar) as archive:
            archive.extractall(unpacked)
        sys.path.insert(0, unpacked)
        try:
            import handler
            import handler.inference  # loaded while the archive's folder exists
            from handler.model import load_model
            from handler.settings import HandlerSettings

            if not Path(handler.__file__ or "").is_relative_to(unpacked):
                raise RuntimeError(
                    f"handler was imported from {handler.__file__}, not from {mar.name}: "
                    "measure each archive in a fresh process (in_fresh_process)"
                )

            if as_a_worker:
                import_worker_modules()
            settings = HandlerSettings.from_mapping(archive_handler_config(mar))
            torch.set_num_threads(threads)
            loaded = load_model(Path(unpacked, "model"), settings, 0 if gpus else None)
        finally:
            sys.path.remove(unpacked)
    return loaded, settings


def import_worker_modules() -> None:
    """What a TorchServe worker imports besides the model: its service loop and every module
    of the archive's handler package (the explanation's libraries included)."""
    import importlib
    import pkgutil

    import handler

    try:
        importlib.import_module("ts.model_service_worker")
    except ImportError:  # TorchServe is not installed here: its modules are not counted
        pass
    for module in pkgutil.iter_modules(handler.__path__):
        importlib.import_module(f"handler.{module.name}")


def process_memory() -> tuple[int, int, int]:
    """(peak RSS, USS, PSS) of this process in bytes, from /proc (0 where it cannot be read)."""
    peak = uss = pss = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Private_Clean", "Private_Dirty"):
                uss += int(rest.split()[0]) * 1024
            elif key == "Pss":
                pss = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return peak, uss, pss


def measure_rates(
    mar: Path, batch_sizes: tuple[int, ...], threads: int, gpus: int, rounds: int = ROUNDS
) -> dict[int, list[float]]:
    """One worker of ``mar``: its texts/s at each batch size, ``rounds`` times, each round
    going through every size once on the same ``SAMPLE_COUNT`` texts."""
    loaded, settings = load_archive(mar, threads, gpus)
    from handler.inference import classify  # the archive's own, imported by load_archive

    texts = sample_texts(max(SAMPLE_COUNT, max(batch_sizes)))

    def one_pass(batch_size: int) -> None:
        for start in range(0, len(texts), batch_size):
            window = texts[start : start + batch_size]
            classify(loaded, window, settings.max_length, loaded.max_batch_tokens)

    for batch_size in batch_sizes:  # warm-up: every shape's first pass is slower
        classify(loaded, texts[:batch_size], settings.max_length, loaded.max_batch_tokens)
    samples: dict[int, list[float]] = {size: [] for size in batch_sizes}
    for _ in range(rounds):
        for batch_size in batch_sizes:
            done, started = 0, time.perf_counter()
            while done == 0 or time.perf_counter() - started < MIN_ROUND_S:
                one_pass(batch_size)
                done += len(texts)
            samples[batch_size].append(round(done / (time.perf_counter() - started), 2))
    return samples


def measure_memory(mar: Path, threads: int, batch_size: int = max(BATCH_SIZES)) -> WorkerMemory:
    """One worker's memory: ``mar``'s model loaded in this process with ``threads`` torch
    threads as a worker loads it (``load_archive(as_a_worker=True)``), and a batch of
    ``batch_size`` texts as long as the handler reads (``max_length`` tokens) classified, then
    the sample texts at every batch size."""
    loaded, settings = load_archive(mar, threads, 0, as_a_worker=True)
    from handler.inference import classify

    longest = " ".join(SAMPLE_WORDS * (1 + settings.max_length // len(SAMPLE_WORDS)))
    classify(loaded, [longest] * batch_size, settings.max_length, loaded.max_batch_tokens)
    texts = sample_texts(SAMPLE_COUNT)
    for size in BATCH_SIZES:  # batches of every shape, as traffic brings them
        for start in range(0, len(texts), size):
            window = texts[start : start + size]
            classify(loaded, window, settings.max_length, loaded.max_batch_tokens)
    peak, uss, pss = process_memory()
    return WorkerMemory(peak, uss, pss)


def device_and_cpu_seconds(
    run_batch: Callable[[], list[float]], seconds: float = DEVICE_MEASURE_S
) -> tuple[float, float]:
    """The median (device s, CPU s) of a batch, run for ``seconds`` (at least 3 times) after
    a warm-up: ``run_batch`` runs one and returns its forward passes' milliseconds, which the
    worker spends waiting for the device; the rest of its wall time is the worker's own."""
    run_batch()
    device: list[float] = []
    cpu: list[float] = []
    started = time.perf_counter()
    while len(device) < 3 or time.perf_counter() - started < seconds:
        batch_started = time.perf_counter()
        forward_s = sum(run_batch()) / 1e3
        device.append(forward_s)
        cpu.append(max(0.0, time.perf_counter() - batch_started - forward_s))
    return statistics.median(device), statistics.median(cpu)


def kernel_seconds(run_batch: Callable[[], object], batches: int = 3) -> float | None:
    """The GPU's busy seconds per batch: the time of the CUDA kernels and copies that the
    profiler (CUPTI) timed over ``batches`` batches, divided by them; None where it timed none
    (no CUDA, or no CUPTI) or failed. A pass's wall time overstates the GPU's share where the
    worker's Python launching the kernels, not the GPU, sets its pace: one process then leaves
    the GPU idle between kernels, and more workers fill it."""
    import torch
    from torch.profiler import DeviceType, ProfilerActivity, profile

    if not torch.cuda.is_available():
        return None
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
            for _ in range(batches):
                run_batch()
    except RuntimeError as error:  # CUPTI taken by another profiler, or refused to this user
        print(f"measure: the GPU's busy time not profiled ({error}); the wall time is used",
              file=sys.stderr)  # fmt: skip
        return None
    busy_us = sum(
        event.self_device_time_total
        for event in profiled.events()
        if event.device_type == DeviceType.CUDA
    )
    return busy_us / 1e6 / batches if busy_us > 0 else None


def measure_device_load(loaded: Any, settings: Any, batch_size: int) -> DeviceLoad:
    """A batch of ``batch_size`` sample texts of a model loaded on a GPU with ``settings``:
    its time on the GPU and the CPU time around it, and the GPU memory of one worker (weights,
    the largest pass's activations, the CUDA context)."""
    import torch

    from handler.inference import classify
    from handler.model import forward

    texts = sample_texts(batch_size)
    device_s, cpu_s = device_and_cpu_seconds(
        lambda: (
            classify(loaded, texts, settings.max_length, loaded.max_batch_tokens)[
                1
            ].sub_batch_forward_ms
        )
    )
    kernel_s = kernel_seconds(
        lambda: classify(loaded, texts, settings.max_length, loaded.max_batch_tokens)
    )
    device = loaded.device
    rows = max(1, loaded.max_batch_tokens // settings.max_length)
    ids = torch.full((rows, settings.max_length), loaded.tokenizer.pad_token_id, dtype=torch.long)
    torch.cuda.reset_peak_memory_stats(device)
    forward(loaded, ids, torch.ones_like(ids))
    free, total = torch.cuda.mem_get_info(device)
    context = max(0, total - free - torch.cuda.memory_reserved(device))
    return DeviceLoad(
        batch_size=batch_size,
        device_s=device_s,
        cpu_s=cpu_s,
        gpu_bytes=torch.cuda.max_memory_reserved(device),
        context_bytes=context,
        kernel_s=kernel_s,
    )


MEASURE_SCRIPT = """import json, sys
from dataclasses import asdict
from pathlib import Path
from bert_serve_server import measure
what, mar, args = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
if what == "rates":
    print(json.dumps(measure.measure_rates(mar, tuple(args[0]), args[1], args[2])))
elif what == "memory":
    print(json.dumps(asdict(measure.measure_memory(mar, args[0]))))
else:
    loaded, settings = measure.load_archive(mar, 1, 1)
    print(json.dumps(asdict(measure.measure_device_load(loaded, settings, args[0]))))
"""


def in_fresh_process(what: str, mar: Path, args: list[Any]) -> Any:
    """``measure_rates`` (``what`` "rates"), ``measure_memory`` ("memory") or
    ``measure_device_load`` ("device_load") of ``mar`` in a fresh Python process, its JSON answer
    decoded: the archive's own ``handler`` package is the one imported, no process-wide setting
    (torch threads, attention kernels, matmul precision) carries over, and the memory measured
    is that worker's alone."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", MEASURE_SCRIPT, what, str(mar.resolve()), json.dumps(args)],
        capture_output=True, text=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    if done.returncode != 0:
        # The whole of it on stderr (the container's log): why the model could not load.
        print(f"measure: {mar.name} ({what}) failed:\n{done.stderr.rstrip()}", file=sys.stderr)
        why = exception_line(done.stderr) or f"exit code {done.returncode}"
        raise RuntimeError(f"measuring {mar.name} failed: {why}")
    return json.loads(done.stdout)


def exception_line(stderr: str) -> str:
    """The first line of the exception a Python traceback ends with (its message can run over
    several lines: transformers' advice follows the cause), else the last line."""
    lines = stderr.strip().splitlines()
    frames = [number for number, line in enumerate(lines) if line.startswith(" ")]
    after = lines[frames[-1] + 1 :] if frames else []
    return (after or lines[-1:] or [""])[0]


CACHE_ENV = "BERT_SERVE_MEASURE_CACHE"
"""A folder where measurements outlive the process: each archive's content measured once per
kind of measurement and arguments, by whichever start comes first (one that asks while another
measures waits for that answer), wherever its copies lie.
The test suite sets it for its whole run (dozens of servers, several processes, a few archives
and their copies); unset, each process measures once per archive version."""


@functools.cache
def content_digest(mar: str, mtime_ns: int) -> str:
    """sha256 of the archive's bytes, once per version (path and mtime) in a process."""
    with open(mar, "rb") as archive:
        return hashlib.file_digest(archive, "sha256").hexdigest()


def remembered(what: str, mar: str, mtime_ns: int, args: list[Any]) -> Any:
    """``in_fresh_process``'s answer, from ``CACHE_ENV``'s folder where it was measured."""
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        return in_fresh_process(what, Path(mar), args)
    key = json.dumps([what, content_digest(mar, mtime_ns), args])
    path = Path(folder) / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    if path.is_file():
        return json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    # One measurer per key: a second start asking while the first measures waits for its
    # answer (two measurements side by side would each see half the machine, and be wrong).
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return json.loads(path.read_text())
        answer = in_fresh_process(what, Path(mar), args)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(answer))
        scratch.replace(path)  # atomic: a process reading it sees all of it or nothing
    return answer


@functools.cache
def measured_samples(
    mar: str, mtime_ns: int, batch_sizes: tuple[int, ...], threads: int, gpus: int
) -> dict[int, list[float]]:
    """``measure_rates`` once per archive version and layout in a process (a test session
    starts many servers on one .mar)."""
    raw = remembered("rates", mar, mtime_ns, [list(batch_sizes), threads, gpus])
    return {int(size): rates for size, rates in raw.items()}


def measured_rates(
    mar: str, mtime_ns: int, batch_sizes: tuple[int, ...], threads: int, gpus: int
) -> dict[int, float]:
    """Each batch size's best texts/s of its rounds (``measured_samples``)."""
    return best_rates(measured_samples(mar, mtime_ns, batch_sizes, threads, gpus))


@functools.cache
def measured_memory(mar: str, mtime_ns: int) -> WorkerMemory:
    """``measure_memory`` once per archive version, in a fresh process, with as many torch
    threads as this process may use (a worker never gets more)."""
    threads = len(os.sched_getaffinity(0))
    return WorkerMemory(**remembered("memory", mar, mtime_ns, [threads]))


@functools.cache
def measured_device_load(mar: str, mtime_ns: int, batch_size: int) -> DeviceLoad:
    """``measure_device_load`` of the archive's own model, once per archive version, in a
    fresh process (``in_fresh_process``)."""
    return DeviceLoad(**remembered("device_load", mar, mtime_ns, [batch_size]))
