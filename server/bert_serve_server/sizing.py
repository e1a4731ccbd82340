"""Serving settings derived from the machine the server starts on, for every value that
config/config.properties leaves out: the workers, ``job_queue_size`` and the JVM heap.

The rule, in the order it is applied:

- **Cores** are the physical cores this process may use: the CPUs of its affinity counted once
  per core (sysfs ``topology``: hyperthreads of one core share its units, so SMT siblings are
  one core, the policy TorchServe's own ``cpu_launcher`` follows), capped by a cgroup CPU quota
  (a container's ``cpu.max`` or ``cpu.cfs_quota_us``). **Memory** is the cgroup limit, else the
  machine's.
- **Workers**: on a CPU, one per core with one torch thread each (``OMP_NUM_THREADS=1``), so
  batches run side by side instead of one batch's small matrices being split across cores.
  Capped so that the workers' memory (the model's weights and ``WORKER_OVERHEAD_BYTES`` each)
  fits in half of the memory.
- **Workers on GPUs**: each with one torch thread (the forward runs on the GPU; on an H100, 16
  threads served 0.62 of the requests/s of one at 32 clients, docs/bench/README.md). A worker's
  CPU side (tokenizing, grouping, scoring) is serial and the GPU waits for it, so the start
  measures, on the archive's own model at its batch size, a batch's time on the GPU and the CPU
  time around it, and puts ``ceil(1 + cpu / gpu)`` workers on each GPU: while one worker's batch
  runs on the GPU, the others' CPU sides run, and that many cover one worker's whole cycle
  (``DeviceLoad.busy_workers``). Then bounded by the cores (one each, ``FRONTEND_CORES`` left to
  the frontend; with fewer cores than GPUs, some GPUs idle), by each GPU's memory
  (``GPU_MEMORY_SHARE`` of it holds its workers' weights, largest pass's activations and CUDA
  context, as measured) and by the host memory (``GPU_WORKER_HOST_BYTES`` a worker). A model
  whose handler config says ``device: cpu`` is sized as on a CPU.
- **Several models** (each version of a name counts as one): the cores left after the workers
  the config states are shared out equally among the others, the first ones taking one more
  while cores remain (2 models on 9 cores: 5 and 4); each model has at least one worker, so
  workers x threads never exceeds the cores unless there are more models than cores (which the
  reasons then say). On GPUs each model has its workers on every GPU. The memory cap takes one
  worker at a time from the model with the most until all fit.
- **Batch size** (``batchSize``): one worker's rate is measured at start on each .mar's own model
  and code at batch sizes ``BATCH_SIZES``; the smallest whose rate is within ``NEAR_BEST`` of the
  best is chosen (a larger batch only adds latency for what it no longer gains). Size 1 is not
  a candidate: serving pays a cost per batch (the frontend's round trip to the worker) that a
  measurement in one process cannot see and only batching shares, and where a batch of 1
  measures about as fast as the best (a small model on one CPU thread), a choice between them
  would follow the noise. Batches form from what is queued within ``maxBatchDelay`` (1 ms in
  the shipped config), so a large ``batchSize`` costs a lone request nothing.
- **Queue** (``job_queue_size``, which TorchServe counts in requests): the requests the workers
  drain in ``PATIENT_S``, the wait of a patient client, at the rate measured for that batch
  size when each request holds one text (the fastest requests drain; a list of up to
  ``max_texts_per_request`` texts drains slower, so fewer of them fill the minute); so a patient
  client is never refused while it could still be answered in time. TorchServe has one size for
  every model's own queue: with several models, the largest of theirs.
- **JVM heap** (``-Xmx``): ``BASE_HEAP_MB`` plus that queue of requests as the frontend holds them
  (``queued_request_bytes``: the body of the longest text the handler accepts, ``max_chars``
  UTF-8 characters of 4 bytes at most, and ``REQUEST_OVERHEAD_BYTES``; never more than
  ``max_request_size``), once per model. At most what the memory leaves beside the workers and
  the JVM's own non-heap memory (``FRONTEND_NON_HEAP_BYTES``), and under ``COMPRESSED_OOPS_MB``
  (past 32 GiB the JVM loses compressed pointers); where a cap binds, the queue is cut to what
  the heap holds. A list request of many long texts holds more than one such text (bodies up to
  ``max_request_size`` are admitted): a queue full of those would not fit, so clients that send
  long lists should state a smaller ``max_request_size`` or a larger heap.
- **Stated settings win, the others follow them**: a stated ``job_queue_size`` gets a heap that
  holds it; a stated heap (``-Xmx``, ``-XX:MaxHeapSize``, or ``-XX:MaxRAMPercentage`` of the
  memory) gets a queue of a patient minute cut to what it holds, and no ``-Xmx`` is added to
  override it; both stated: both kept.

The batch delay stays in the config (``models=``). A model whose archive cannot be read or
whose model cannot be loaded for measuring is left out (``Resolved.refused``, with the reason):
the others are served.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bert_serve_server.config import properties_text, read_properties
from bert_serve_server.models import without as without_models

PATIENT_S = 60.0
MEASURE_S = 0.6
"""Seconds of measuring a batch size, after one warm-up batch (at least one batch)."""
BATCH_SIZES = (2, 4, 8, 16, 32, 64)
NEAR_BEST = 0.9
BASE_HEAP_MB = 256
FRONTEND_NON_HEAP_BYTES = 192 * 2**20
"""The JVM's memory besides its heap: metaspace, code cache, thread stacks, Netty's direct
buffers (deploy/image-test.json's frontend PSS less its heap was about 130 MiB)."""
COMPRESSED_OOPS_MB = 31 * 1024
"""Under 32 GiB the JVM keeps compressed object pointers; a sized heap stays below it."""
DEFAULT_MAX_CHARS = 10_000
"""handler/settings.py's ``max_chars`` where an archive's model-config.yaml states none (a unit
test keeps the two equal)."""
UTF8_MAX_BYTES = 4
REQUEST_OVERHEAD_BYTES = 4096
"""A queued request besides its body: the frontend's job, its headers and the JSON around the
text."""
WORKER_MEMORY_SHARE = 0.5
WORKER_OVERHEAD_BYTES = 300 * 2**20
"""A worker's memory besides its model's weights: Python, torch, transformers, TorchServe."""
GPU_WORKER_HOST_BYTES = 1216 * 2**20
"""A GPU worker's host memory: the USS of a worker serving a bert-base-sized model on an H100
(docs/bench/h100/results.json, ``scenarios.torchserve_batched.worker_memory``); the weights
live on the GPU, the CUDA libraries and their host buffers here."""
FRONTEND_CORES = 1
"""Cores left to TorchServe's frontend (HTTP, batching) beside GPU workers, whose CPU sides
keep the other cores busy."""
GPU_MEMORY_SHARE = 0.9
"""Of each GPU's memory, what its workers may hold: the rest for the allocator's fragmentation."""
MB = 2**20
DEFAULT_MAX_REQUEST_BYTES = 6_553_500
"""TorchServe 0.12's own ``max_request_size``."""
HEAP_FLAG = re.compile(r"-(?:Xmx|XX:MaxHeapSize=)(\d+)([kKmMgGtT]?)(?=\s|$)")
RAM_PERCENTAGE_FLAG = re.compile(r"-XX:MaxRAMPercentage=(\d+(?:\.\d*)?)(?=\s|$)")
SAMPLE_WORDS = (
    "the film was slow at first but the acting and the score carried it to a fine end "
    "although some scenes dragged and the plot left a few questions open for the next one"
).split()
CGROUP = Path("/sys/fs/cgroup")
CPU_TOPOLOGY = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Machine:
    cores: float
    memory_bytes: int
    gpus: int
    gpu_memory_bytes: int = 0
    """The smallest of the GPUs' memories (0: no GPU, or not known)."""


@dataclass(frozen=True)
class DeviceLoad:
    """One worker's batch on a GPU, measured at start on the archive's own model."""

    batch_size: int
    device_s: float
    """The batch's forward passes, which the worker waits for (the device's time)."""
    cpu_s: float
    """The rest of the batch's time in the worker: tokenizing, grouping, scoring (the
    frontend's round trip and the request's decoding are not in it)."""
    gpu_bytes: int
    """Weights and the activations of the largest pass (``max_batch_tokens``), as torch holds them."""
    context_bytes: int
    """The GPU memory besides torch's own: the CUDA context (and what else held the GPU)."""

    @property
    def busy_workers(self) -> int:
        """Workers per GPU that keep it busy: n workers cover one worker's cycle (CPU side,
        then its batch on the GPU) once n x device_s >= cpu_s + device_s."""
        return max(1, math.ceil(1 + self.cpu_s / max(self.device_s, 1e-9) - 1e-9))

    @property
    def worker_gpu_bytes(self) -> int:
        return self.gpu_bytes + self.context_bytes


def cgroup_cores(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in cores (v2 ``cpu.max``, v1 cfs), if any."""
    v2 = root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().partition(" ")
        return None if quota == "max" else int(quota) / int(period)
    v1_quota, v1_period = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
    if v1_quota.is_file() and v1_period.is_file():
        quota_us = int(v1_quota.read_text())
        return None if quota_us <= 0 else quota_us / int(v1_period.read_text())
    return None


def cgroup_memory(root: Path = CGROUP) -> int | None:
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        if path.is_file():
            text = path.read_text().strip()
            # v1 writes "no limit" as a huge number
            return None if text == "max" or int(text) >= 2**60 else int(text)
    return None


def physical_cores(cpus: set[int], topology: Path = CPU_TOPOLOGY) -> int:
    """The cores that ``cpus`` (logical CPUs, hyperthreads included) sit on: one per
    (package, core) of sysfs topology; a CPU whose topology cannot be read counts as a core."""
    cores: set[tuple[str, ...]] = set()
    for cpu in cpus:
        folder = topology / f"cpu{cpu}" / "topology"
        try:
            package = (folder / "physical_package_id").read_text().strip()
            core = (folder / "core_id").read_text().strip()
        except OSError:
            cores.add(("cpu", str(cpu)))
            continue
        cores.add((package, core))
    return len(cores)


def read_machine(gpus: int, cgroup: Path = CGROUP, topology: Path = CPU_TOPOLOGY) -> Machine:
    """Physical cores of this process's affinity capped by the cgroup quota; the cgroup's
    memory limit, else the machine's; with ``gpus`` of its GPUs (their memory read here)."""
    cores: float = physical_cores(os.sched_getaffinity(0), topology)
    quota = cgroup_cores(cgroup)
    if quota is not None:
        cores = min(cores, quota)
    memory = cgroup_memory(cgroup) or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu_memory = 0
    if gpus:
        import torch

        gpu_memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus))
    return Machine(cores=cores, memory_bytes=memory, gpus=gpus, gpu_memory_bytes=gpu_memory)


def serving_gpus(properties: dict[str, str]) -> int:
    """The GPUs TorchServe hands to workers: this machine's, capped by ``number_of_gpu``."""
    return min(gpu_count(), int(properties.get("number_of_gpu", sys.maxsize)))


def workers_for(
    machine: Machine, worker_bytes: int, load: DeviceLoad | None = None
) -> tuple[int, list[str]]:
    """Workers for one model: on GPUs (``load`` measured there) as many per GPU as keep it
    busy, else one per core; no more than the cores, GPU memory and half of the memory hold."""
    (workers,), reasons = shared_workers(
        machine, [worker_bytes], loads=None if load is None else [load]
    )
    return workers, reasons


def cpu_workers(machine: Machine, count: int, stated: int) -> tuple[list[int], list[str]]:
    """The cores left after ``stated`` workers, shared out equally among ``count`` models."""
    cores = max(count, math.floor(machine.cores) - stated)
    workers = [cores // count + (i < cores % count) for i in range(count)]
    reasons = [f"{machine.cores:g} cores: one worker per core"]
    if count > 1 or stated:
        reasons = [
            f"{machine.cores:g} cores, {stated} worker(s) set by the config: the rest "
            f"shared among {count} model(s), one worker per core: {workers}"
        ]
    if count + stated > machine.cores:
        reasons.append(
            f"{count + stated} workers on {machine.cores:g} cores: every model needs one, "
            "so they share cores"
        )
    return workers, reasons


def gpu_workers(
    machine: Machine, loads: list[DeviceLoad], stated: int = 0
) -> tuple[list[int], list[str]]:
    """Workers for models on every GPU (one ``DeviceLoad`` per model), besides ``stated``
    workers: as many per GPU as keep it busy, then cut to the cores (less the frontend's) and
    to each GPU's memory, one at a time from the model with the most."""
    gpus, count = machine.gpus, len(loads)
    per_gpu = [load.busy_workers for load in loads]
    reasons = [
        f"{gpus} GPU(s): {n} worker(s) on each keep it busy: a batch of {load.batch_size} took "
        f"{load.device_s * 1e3:.2f} ms on the GPU and {load.cpu_s * 1e3:.2f} ms of a worker's "
        f"CPU around it (measured at start): ceil(1 + cpu / gpu)"
        for n, load in zip(per_gpu, loads, strict=True)
    ]
    cores = max(1, math.floor(machine.cores) - FRONTEND_CORES - stated)
    before = list(per_gpu)
    while gpus * sum(per_gpu) > cores and max(per_gpu) > 1:
        per_gpu[max(range(count), key=lambda i: (per_gpu[i], i))] -= 1
    if per_gpu != before:
        reasons.append(
            f"cut to {per_gpu} per GPU: one core per worker, {cores} of {machine.cores:g} "
            f"({FRONTEND_CORES} left to the frontend"
            + (f", {stated} to the config's workers)" if stated else ")")
        )
    workers = [gpus * n for n in per_gpu]
    if sum(workers) > cores:
        workers = [max(1, cores // count + (i < cores % count)) for i in range(count)]
        reasons.append(
            f"{cores} core(s) for workers, fewer than {gpus} GPU(s) x {count} model(s): "
            f"{workers} worker(s), so some GPUs stay idle"
        )
    if machine.gpu_memory_bytes:
        budget = machine.gpu_memory_bytes * GPU_MEMORY_SHARE

        def on_one_gpu() -> int:
            return sum(
                math.ceil(n / gpus) * load.worker_gpu_bytes
                for n, load in zip(workers, loads, strict=True)
            )

        before = list(workers)
        while on_one_gpu() > budget and max(workers) > 1:
            workers[max(range(count), key=lambda i: (workers[i], i))] -= 1
        sizes = [load.worker_gpu_bytes // MB for load in loads]
        if workers != before:
            reasons.append(
                f"cut to {workers} worker(s): {sizes} MiB of GPU memory each (weights, the "
                f"largest pass, the CUDA context) must fit in {GPU_MEMORY_SHARE:.0%} of "
                f"{machine.gpu_memory_bytes // MB} MiB per GPU"
            )
        if on_one_gpu() > budget:
            reasons.append(
                f"{sizes} MiB of GPU memory per worker do not fit in {GPU_MEMORY_SHARE:.0%} of "
                f"{machine.gpu_memory_bytes // MB} MiB: the workers may run out of GPU memory"
            )
    return workers, reasons


def shared_workers(
    machine: Machine,
    worker_bytes: list[int],
    stated: int = 0,
    stated_bytes: int = 0,
    loads: list[DeviceLoad] | None = None,
) -> tuple[list[int], list[str]]:
    """Workers for models of ``worker_bytes`` of host memory each (one entry per model),
    besides ``stated`` workers the config sets (holding ``stated_bytes``): on GPUs, for models
    with their ``loads`` measured there, ``gpu_workers``; else the cores left shared out
    equally; then cut, one at a time from the model with the most (the last of them), until
    the workers fit in half of the memory."""
    count = len(worker_bytes)
    if loads is not None and machine.gpus:
        workers, reasons = gpu_workers(machine, loads, stated)
    else:
        workers, reasons = cpu_workers(machine, count, stated)
    budget = machine.memory_bytes * WORKER_MEMORY_SHARE - stated_bytes

    def used() -> float:
        return sum(n * size for n, size in zip(workers, worker_bytes, strict=True))

    before = list(workers)
    while used() > budget and max(workers) > 1:
        workers[max(range(count), key=lambda i: (workers[i], i))] -= 1
    if workers != before:
        reasons.append(
            f"cut to {workers} worker(s): {[size // MB for size in worker_bytes]} MiB each "
            f"must fit in half of {machine.memory_bytes // MB} MiB"
        )
    return workers, reasons


def threads_for(machine: Machine, workers: int) -> int:
    """On a CPU, the cores shared among the workers, at least one torch thread each. On GPUs,
    one: the forward runs on the GPU, and more CPU threads only spin beside the tokenizer."""
    return 1 if machine.gpus else max(1, math.floor(machine.cores) // workers)


def queued_request_bytes(max_request_bytes: int, max_chars: int = DEFAULT_MAX_CHARS) -> int:
    """What one queued request holds in the frontend's heap: the body of the longest text the
    handler accepts (``max_chars`` characters of up to 4 UTF-8 bytes) and the request's own
    objects; never more than a body the frontend admits (``max_request_size``)."""
    return min(max_request_bytes, max_chars * UTF8_MAX_BYTES + REQUEST_OVERHEAD_BYTES)


def heap_room_mb(machine: Machine, reserved_bytes: int) -> int:
    """The largest heap the memory leaves beside ``reserved_bytes`` (the workers) and the JVM's
    non-heap memory, under the compressed-pointer limit; never under ``BASE_HEAP_MB``."""
    room = (machine.memory_bytes - reserved_bytes - FRONTEND_NON_HEAP_BYTES) // MB
    return int(max(BASE_HEAP_MB, min(COMPRESSED_OOPS_MB, room)))


def derive(
    machine: Machine,
    workers: int,
    texts_per_s: float,
    request_bytes: int,
    queues: int = 1,
    reserved_bytes: int = 0,
    stated_queue: int | None = None,
    stated_heap_mb: int | None = None,
) -> tuple[int, int, list[str]]:
    """(job_queue_size, heap MiB, why) for ``workers`` that each classify ``texts_per_s``; each
    queued request holds ``request_bytes`` and the heap holds ``queues`` such queues (one per
    model) beside ``reserved_bytes`` of workers. A stated queue or heap is kept and the other
    follows from it."""
    request_mb = request_bytes / MB
    room_mb = heap_room_mb(machine, reserved_bytes)
    if stated_queue is not None:
        queue = stated_queue
        reasons = [f"queue {queue} requests: as the config sets"]
    else:
        queue = max(1, int(texts_per_s * workers * PATIENT_S))
        reasons = [
            f"queue {queue} requests: {workers} worker(s) x {texts_per_s:g} texts/s (measured at "
            f"start) drain that many one-text requests in {PATIENT_S:.0f} s"
        ]
    if stated_heap_mb is not None:
        heap_mb = stated_heap_mb
        reasons.append(f"heap {heap_mb} MiB: as the config sets")
        fits = max(1, int((heap_mb - BASE_HEAP_MB) / request_mb / queues))
        if stated_queue is None and queue > fits:
            queue = fits
            reasons.append(
                f"queue cut to {queue}: what the stated heap holds over {BASE_HEAP_MB} MiB, "
                f"{queues} queue(s) of requests of {request_bytes // 1024} KiB"
            )
        return queue, heap_mb, reasons
    heap_mb = int(BASE_HEAP_MB + math.ceil(queues * queue * request_mb))
    shown = "the queue" if queues == 1 else f"{queues} queues (one per model)"
    if heap_mb <= room_mb:
        reasons.append(
            f"heap {heap_mb} MiB: {BASE_HEAP_MB} MiB + {shown} of requests of "
            f"{request_bytes // 1024} KiB (the longest text the handler accepts)"
        )
        return queue, heap_mb, reasons
    heap_mb = room_mb
    limit = (
        f"the compressed-pointer limit ({COMPRESSED_OOPS_MB} MiB)"
        if room_mb == COMPRESSED_OOPS_MB
        else f"what {machine.memory_bytes // MB} MiB leaves beside the workers and the JVM"
    )
    if stated_queue is not None:
        reasons.append(
            f"heap {heap_mb} MiB: {limit}; it holds fewer than the stated queue of "
            f"{request_bytes // 1024} KiB requests"
        )
        return queue, heap_mb, reasons
    queue = max(1, int((heap_mb - BASE_HEAP_MB) / request_mb / queues))
    reasons.append(
        f"queue cut to {queue}: a heap of {heap_mb} MiB ({limit}) holds {shown} of that many "
        f"requests of {request_bytes // 1024} KiB"
    )
    return queue, heap_mb, reasons


def sample_texts(count: int) -> list[str]:
    """Texts of 8 to 71 words, their lengths spread as reviews' are: the rate depends on the
    lengths and on how a batch groups them, not on the words."""
    return [
        " ".join(SAMPLE_WORDS[(i + j) % len(SAMPLE_WORDS)] for j in range(8 + i * 37 % 64))
        for i in range(count)
    ]


def archive_handler_config(mar: Path) -> dict[str, Any]:
    """The ``handler:`` section of the .mar's own model config (empty where it has none)."""
    import yaml

    with zipfile.ZipFile(mar) as archive:
        if "model-config.yaml" not in archive.namelist():
            return {}
        raw = yaml.safe_load(archive.read("model-config.yaml")) or {}
    return dict(raw.get("handler") or {})


def runs_on_gpu(machine: Machine, mar: Path) -> bool:
    """The model's workers will use a GPU: there is one, and its config does not say ``cpu``."""
    return bool(machine.gpus) and archive_handler_config(mar).get("device", "auto") != "cpu"


def load_archive(mar: Path, threads: int, gpus: int) -> tuple[Any, Any]:
    """(loaded model, handler settings) of the .mar's own model, handler code and settings,
    in this process with ``threads`` torch threads (on GPU 0 where there is one). This process
    must not have imported ``handler`` yet: ``in_fresh_process`` runs it in a fresh one."""
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

            settings = HandlerSettings.from_mapping(archive_handler_config(mar))
            torch.set_num_threads(threads)
            loaded = load_model(Path(unpacked, "model"), settings, 0 if gpus else None)
        finally:
            sys.path.remove(unpacked)
    return loaded, settings


def measure_rates(
    mar: Path, batch_sizes: tuple[int, ...], threads: int, gpus: int, seconds: float = MEASURE_S
) -> dict[int, float]:
    """One worker's texts/s at each batch size: the .mar's own model, handler code and
    settings, in this process with ``threads`` torch threads (on GPU 0 where there is one)."""
    loaded, settings = load_archive(mar, threads, gpus)
    from handler.inference import classify  # the archive's own, imported by load_archive

    rates = {}
    for batch_size in batch_sizes:
        texts = sample_texts(batch_size * 8)
        windows = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
        classify(loaded, windows[-1], settings.max_length, loaded.max_batch_tokens)
        done, started = 0, time.perf_counter()
        while done == 0 or time.perf_counter() - started < seconds:
            window = windows[done // batch_size % len(windows)]
            classify(loaded, window, settings.max_length, loaded.max_batch_tokens)
            done += batch_size
        rates[batch_size] = round(done / (time.perf_counter() - started), 1)
    return rates


def device_and_cpu_seconds(
    run_batch: Callable[[], list[float]], seconds: float = MEASURE_S
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
    )


@functools.cache
def measured_device_load(mar: str, mtime_ns: int, batch_size: int) -> DeviceLoad:
    """``measure_device_load`` of the archive's own model, once per archive version, in a
    fresh process (``in_fresh_process``)."""
    return DeviceLoad(**in_fresh_process("device_load", Path(mar), [batch_size]))


def batch_size_for(rates: dict[int, float]) -> tuple[int, str]:
    """The smallest batch size within ``NEAR_BEST`` of the best measured rate, and why."""
    best = max(rates.values())
    chosen = min(size for size, rate in rates.items() if rate >= NEAR_BEST * best)
    measured = ", ".join(f"{rate} at {size}" for size, rate in rates.items())
    return chosen, (
        f"batchSize {chosen}: the smallest within {1 - NEAR_BEST:.0%} of the best of one "
        f"worker's texts/s measured at start ({measured})"
    )


def holds_a_model(mar: Path) -> bool:
    """The .mar has a Hugging Face folder (``model/config.json``) to measure."""
    with zipfile.ZipFile(mar) as archive:
        return "model/config.json" in archive.namelist()


@functools.cache
def measured_rates(
    mar: str, mtime_ns: int, batch_sizes: tuple[int, ...], threads: int, gpus: int
) -> dict[int, float]:
    """``measure_rates`` once per archive version and layout in a process (a test session
    starts many servers on one .mar)."""
    rates = in_fresh_process("rates", Path(mar), [list(batch_sizes), threads, gpus])
    return {int(size): rate for size, rate in rates.items()}


MEASURE_SCRIPT = """import json, sys
from dataclasses import asdict
from pathlib import Path
from bert_serve_server import sizing
what, mar, args = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
if what == "rates":
    print(json.dumps(sizing.measure_rates(mar, tuple(args[0]), args[1], args[2])))
else:
    loaded, settings = sizing.load_archive(mar, 1, 1)
    print(json.dumps(asdict(sizing.measure_device_load(loaded, settings, args[0]))))
"""


def in_fresh_process(what: str, mar: Path, args: list[Any]) -> Any:
    """``measure_rates`` (``what`` "rates") or ``measure_device_load`` ("device_load") of
    ``mar`` in a fresh Python process, its JSON answer decoded: the archive's own ``handler``
    package is the one imported, and no process-wide setting (torch threads, attention
    kernels, matmul precision) carries from one archive to the next or into this process."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", MEASURE_SCRIPT, what, str(mar.resolve()), json.dumps(args)],
        capture_output=True, text=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise RuntimeError(f"measuring {mar.name} failed: {lines[-1]}")
    return json.loads(done.stdout)


def heap_mb_in(vmargs: str, memory_bytes: int | None = None) -> int | None:
    """The heap ``vmargs`` state in MiB: the last ``-Xmx`` or ``-XX:MaxHeapSize`` (the JVM takes
    the last), else ``-XX:MaxRAMPercentage`` of ``memory_bytes`` where that is given."""
    found = HEAP_FLAG.findall(vmargs)
    if found:
        number, unit = found[-1]
        scale = {"": 1 / MB, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit.lower()]
        return int(int(number) * scale)
    percentages = RAM_PERCENTAGE_FLAG.findall(vmargs)
    if percentages and memory_bytes is not None:
        return int(memory_bytes * float(percentages[-1]) / 100 // MB)
    return None


def heap_stated(vmargs: str) -> bool:
    return bool(HEAP_FLAG.search(vmargs) or RAM_PERCENTAGE_FLAG.search(vmargs))


def archive_max_chars(mar: Path) -> int:
    """The handler's ``max_chars`` in the archive's model-config.yaml, else its default."""
    import yaml

    with zipfile.ZipFile(mar) as archive:
        if "model-config.yaml" not in archive.namelist():
            return DEFAULT_MAX_CHARS
        raw = yaml.safe_load(archive.read("model-config.yaml")) or {}
    handler = raw.get("handler") or {}
    return int(handler.get("max_chars", DEFAULT_MAX_CHARS))


@dataclass(frozen=True)
class Resolved:
    properties: dict[str, str]
    """The config with every derived value filled in."""
    torch_threads: int
    reasons: tuple[str, ...]
    refused: dict[str, str] = field(default_factory=dict)
    """``NAME:VERSION`` -> why that model is left out of ``properties``."""
    device_loads: dict[str, DeviceLoad] = field(default_factory=dict)
    """``NAME:VERSION`` -> its batch on the GPU as measured at start, for models sized there."""


@dataclass(frozen=True)
class Served:
    """One model version of a ``models=`` entry and its archive."""

    name: str
    version: str
    entry: dict[str, Any]
    mar: Path

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}"


def served_list(properties: dict[str, str]) -> list[Served]:
    store = Path(properties["model_store"])
    return [
        Served(name, version, entry, store / entry.get("marName", f"{name}.mar"))
        for name, versions in json.loads(properties["models"]).items()
        for version, entry in versions.items()
    ]


def worker_host_bytes(model: Served, on_gpu: frozenset[str]) -> int:
    """One worker's host memory: a GPU worker's as measured on a GPU, else the archive (its
    weights) and ``WORKER_OVERHEAD_BYTES``."""
    if model.key in on_gpu:
        return GPU_WORKER_HOST_BYTES
    return model.mar.stat().st_size + WORKER_OVERHEAD_BYTES


def with_workers(
    machine: Machine,
    models: list[Served],
    loads: dict[str, DeviceLoad] | None = None,
    on_gpu: frozenset[str] = frozenset(),
) -> tuple[list[Served], int, list[str]]:
    """Each model with its workers (the config's, else ``shared_workers``: on the GPUs for the
    models of ``loads``, then the cores left for the others), and the torch threads per worker.
    ``on_gpu``: the models whose workers use a GPU (their host memory is a GPU worker's)."""
    loads = loads or {}
    sizes = {model.key: worker_host_bytes(model, on_gpu) for model in models}
    stated = [model for model in models if "minWorkers" in model.entry]
    unstated = [model for model in models if "minWorkers" not in model.entry]
    taken = sum(int(model.entry["minWorkers"]) for model in stated)
    taken_bytes = sum(int(m.entry["minWorkers"]) * sizes[m.key] for m in stated)
    reasons = ["workers: as the config sets"] if stated else []
    chosen: dict[str, int] = {}
    on_gpus = [m for m in unstated if m.key in loads]
    on_cpu = [m for m in unstated if m.key not in loads]
    for group, group_loads in ((on_gpus, [loads[m.key] for m in on_gpus]), (on_cpu, None)):
        if not group:
            continue
        group_machine = machine if group_loads else replace(machine, gpus=0)
        counts, why = shared_workers(
            group_machine, [sizes[m.key] for m in group], taken, taken_bytes, group_loads
        )
        if on_gpus and on_cpu:
            where = "on the GPUs" if group_loads else "on the CPU (device: cpu)"
            why = [f"{', '.join(m.key for m in group)} {where}: {reason}" for reason in why]
        reasons += why
        chosen |= {m.key: n for m, n in zip(group, counts, strict=True)}
        taken += sum(counts)
        taken_bytes += sum(n * sizes[m.key] for m, n in zip(group, counts, strict=True))
    if chosen:
        models = [
            model
            if model.key not in chosen
            else replace(
                model,
                entry={"minWorkers": chosen[model.key], "maxWorkers": chosen[model.key]}
                | model.entry,
            )
            for model in models
        ]
    total = sum(int(model.entry["minWorkers"]) for model in models)
    threads = 1 if on_gpu else threads_for(replace(machine, gpus=0), total)
    cause = "the forward runs on the GPU" if on_gpu else "the cores shared among them"
    reasons.append(f"{threads} torch thread(s) per worker: {cause}")
    return models, threads, reasons


def with_batch_size(
    model: Served, threads: int, machine: Machine, measure_queue: bool
) -> tuple[Served, float | None, list[str]]:
    """The model with its batch size (the config's, else measured) and its rate at that size;
    a rate of None where the archive holds no model or nothing needs measuring."""
    if not holds_a_model(model.mar):
        return (
            model,
            None,
            [
                f"{model.mar.name} holds no model folder: batch size, queue and heap as "
                "TorchServe sets them"
            ],
        )
    if "batchSize" in model.entry and not measure_queue:
        return model, None, []
    stated = "batchSize" in model.entry
    sizes = (int(model.entry["batchSize"]),) if stated else BATCH_SIZES
    mar = model.mar
    rates = measured_rates(str(mar), mar.stat().st_mtime_ns, sizes, threads, machine.gpus)
    if stated:
        return model, rates[sizes[0]], []
    batch_size, why = batch_size_for(rates)
    entry = model.entry | {"batchSize": batch_size}
    return replace(model, entry=entry), rates[batch_size], [why]


def resolve(properties: dict[str, str], gpus: int | None = None) -> Resolved:
    """``properties`` with what they leave out derived from this machine: each model's
    workers and ``batchSize`` (``models=``), ``job_queue_size`` and the heap (``-Xmx`` in
    ``vmargs``); and the torch threads per worker. Values the config states are kept. A model
    whose archive cannot be read or loaded is left out, with the reason (``refused``)."""
    if gpus is None:
        gpus = serving_gpus(properties)
    machine = read_machine(gpus)
    models = served_list(properties)
    refused = {m.key: f"{m.mar} is missing" for m in models if not m.mar.is_file()}
    on_gpu = gpu_models(machine, models, refused)
    models = [model for model in models if model.key not in refused]
    if not on_gpu:
        machine = replace(machine, gpus=0)  # every model on the CPU: sized as on a CPU machine
    reasons: list[str] = []
    threads = 1
    if models and not on_gpu:
        models, threads, reasons = with_workers(machine, models)
    resolved = dict(properties)
    max_request = int(properties.get("max_request_size", DEFAULT_MAX_REQUEST_BYTES))
    vmargs = properties.get("vmargs", "")
    stated_queue = int(properties["job_queue_size"]) if "job_queue_size" in properties else None
    stated_heap = heap_mb_in(vmargs, machine.memory_bytes)
    measure_queue = stated_queue is None
    sized, rates, batch_reasons = with_batch_sizes(models, threads, machine, measure_queue, refused)
    loads: dict[str, DeviceLoad] = {}
    if on_gpu:
        sized, loads = with_device_loads(sized, on_gpu, refused)
        if sized:
            sized, threads, reasons = with_workers(machine, sized, loads, on_gpu)
    reasons += batch_reasons
    drains = [
        (int(model.entry["minWorkers"]), rate)
        for model in sized
        if (rate := rates[model.key]) is not None
    ]
    holding = [model for model in sized if holds_a_model(model.mar)]
    if holding and (drains or stated_queue is not None):
        workers, rate = max(drains or [(0, 0.0)], key=lambda drain: drain[0] * drain[1])
        request_bytes = max(
            queued_request_bytes(max_request, archive_max_chars(m.mar)) for m in holding
        )
        reserved = sum(int(m.entry["minWorkers"]) * worker_host_bytes(m, on_gpu) for m in sized)
        queue, heap_mb, why = derive(
            machine, workers, rate, request_bytes, len(holding), reserved, stated_queue,
            stated_heap,
        )  # fmt: skip
        resolved["job_queue_size"] = str(queue)
        if not heap_stated(vmargs):
            resolved["vmargs"] = f"{vmargs} -Xmx{heap_mb}m".strip()
        reasons += why
    models_entry: dict[str, dict[str, Any]] = {}
    for model in sized:
        models_entry.setdefault(model.name, {})[model.version] = model.entry
    resolved["models"] = json.dumps(models_entry)
    if refused:
        resolved = without_models(resolved, refused)
    return Resolved(resolved, threads, tuple(reasons), refused, loads)


def gpu_models(machine: Machine, models: list[Served], refused: dict[str, str]) -> frozenset[str]:
    """The models (not yet ``refused``) whose workers use a GPU; an archive that cannot be read
    is added to ``refused``."""
    on_gpu = set()
    for model in models:
        try:
            if model.key not in refused and runs_on_gpu(machine, model.mar):
                on_gpu.add(model.key)
        except Exception as error:  # not a readable archive
            refused[model.key] = f"{type(error).__name__}: {error}"
    return frozenset(on_gpu)


def with_batch_sizes(
    models: list[Served],
    threads: int,
    machine: Machine,
    measure_queue: bool,
    refused: dict[str, str],
) -> tuple[list[Served], dict[str, float | None], list[str]]:
    """``with_batch_size`` for each model: those still served, their rates and the reasons;
    a model whose own code fails is added to ``refused`` and the others are served."""
    sized: list[Served] = []
    rates: dict[str, float | None] = {}
    reasons: list[str] = []
    for model in models:
        try:
            model, rate, why = with_batch_size(model, threads, machine, measure_queue)
        except Exception as error:  # the model's own code failed: leave it out, serve the rest
            refused[model.key] = f"{type(error).__name__}: {error}"
            continue
        label = f"{model.key}: " if len(models) > 1 else ""
        reasons += [label + reason for reason in why]
        sized.append(model)
        rates[model.key] = rate
    return sized, rates, reasons


def with_device_loads(
    models: list[Served], on_gpu: frozenset[str], refused: dict[str, str]
) -> tuple[list[Served], dict[str, DeviceLoad]]:
    """The models still served, and the ``DeviceLoad`` at its batch size of each whose GPU
    workers the start sizes (on a GPU, no workers in the config, a model in the archive); a
    model whose measurement fails is added to ``refused``."""
    kept, loads = [], {}
    for model in models:
        if model.key in on_gpu and "minWorkers" not in model.entry and holds_a_model(model.mar):
            batch_size = int(model.entry.get("batchSize", max(BATCH_SIZES)))
            try:
                loads[model.key] = measured_device_load(
                    str(model.mar), model.mar.stat().st_mtime_ns, batch_size
                )
            except Exception as error:  # the model's own code failed: leave it out
                refused[model.key] = f"{type(error).__name__}: {error}"
                continue
        kept.append(model)
    return kept, loads


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def report(resolved: Resolved) -> dict[str, Any]:
    """What ``make status`` and the start-up output show: the values in force and why."""
    return {
        "models": json.loads(resolved.properties["models"]),
        "refused": dict(resolved.refused),
        "job_queue_size": resolved.properties.get("job_queue_size"),
        "vmargs": resolved.properties.get("vmargs", ""),
        "torch_threads": resolved.torch_threads,
        "device_loads": {key: asdict(load) for key, load in resolved.device_loads.items()},
        "why": list(resolved.reasons),
    }


INFERENCE_ADDRESS_ENV = "BERT_SERVE_INFERENCE_ADDRESS"
"""Where the image's TorchServe serves inference instead of the baked config's 0.0.0.0: the
Kubernetes Deployment sets ``http://127.0.0.1:8080``, so only its proxy sidecar reaches it;
KServe's runtime, which has no sidecar, leaves it unset."""


def main(argv: list[str] | None = None) -> int:
    """The image's entrypoint step: resolve the config that TorchServe's own arguments name
    (``--ts-config``), write it to ``--out``, print the torch threads per worker. The inference
    address is ``BERT_SERVE_INFERENCE_ADDRESS`` where that is set."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_serve_server size", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("torchserve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    torchserve = argparse.ArgumentParser(add_help=False)
    torchserve.add_argument("--ts-config", type=Path, required=True)
    given = args.torchserve_args[1:] if args.torchserve_args[:1] == ["--"] else args.torchserve_args
    config = torchserve.parse_known_args(given)[0].ts_config
    resolved = resolve(read_properties(config))
    address = os.environ.get(INFERENCE_ADDRESS_ENV)
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
    for reason in resolved.reasons:
        print(f"sizing: {reason}", file=sys.stderr)
    print(resolved.torch_threads)
    return 0
