"""The sizing rules as pure functions: from a ``Machine`` and what was measured (or stated) to
workers, torch threads, ``batchSize``, the queue and the heap, each with its reasons. Nothing
here reads the machine, a file or the clock (``bert_serve_server.sizing`` has the whole rule).

Units: ``*_bytes`` are bytes, ``*_mib`` are MiB (2**20 bytes); TorchServe's ``job_queue_size``
counts requests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bert_serve_server.machine import Machine

PATIENT_S = 60.0
BATCH_SIZES = (2, 4, 8, 16, 32, 64)
NEAR_BEST = 0.9
MIB = 2**20
BASE_HEAP_MIB = 256
"""The frontend's own heap before any queued request (TorchServe's objects, Netty's pools)."""
FRONTEND_NON_HEAP_BYTES = 192 * MIB
"""The JVM's memory besides its heap: metaspace, code cache, thread stacks, Netty's direct
buffers (deploy/image-test.json's frontend PSS less its heap was about 130 MiB)."""
COMPRESSED_OOPS_MIB = 31 * 1024
"""Under 32 GiB the JVM keeps compressed object pointers; a sized heap stays below it."""
DEFAULT_MAX_CHARS = 10_000
"""handler/settings.py's ``max_chars`` where an archive's model-config.yaml states none (a unit
test keeps the two equal)."""
DEFAULT_MAX_TEXTS = 64
"""handler/settings.py's ``max_texts_per_request``, likewise."""
JSON_ESCAPED_MAX_BYTES = 6
"""The most bytes one character of a text takes in a JSON body (``\\uXXXX``)."""
REQUEST_OVERHEAD_BYTES = 4096
"""A queued request besides its body: the frontend's job, its headers and the JSON around the
texts."""
WORKER_MEMORY_SHARE = 0.5
UNMEASURED_WORKER_OVERHEAD_BYTES = 300 * MIB
"""An archive with no model folder cannot be measured: its worker is budgeted as the archive
and this (Python, torch, TorchServe)."""
GPU_WORKER_HOST_BYTES = 1216 * MIB
"""A GPU worker's host memory: the USS of a worker serving a bert-base-sized model on an H100
(docs/bench/h100/results.json, ``scenarios.torchserve_batched.worker_memory``); the weights
live on the GPU, the CUDA libraries and their host buffers here."""
FRONTEND_CORES = 1
"""Cores left to TorchServe's frontend (HTTP, batching) beside GPU workers."""
GPU_MEMORY_SHARE = 0.9
"""Of each GPU's memory, what its workers may hold: the rest for the allocator's fragmentation."""


HEAP_FLAG = re.compile(r"-(?:Xmx|XX:MaxHeapSize=)(\d+)([kKmMgGtT]?)(?=\s|$)")
MIN_HEAP_FLAG = re.compile(r"-(?:Xms|XX:InitialHeapSize=)(\d+)([kKmMgGtT]?)(?=\s|$)")
RAM_PERCENTAGE_FLAG = re.compile(r"-XX:MaxRAMPercentage=(\d+(?:\.\d*)?)(?=\s|$)")


def heap_mib_in(
    vmargs: str, memory_bytes: int | None = None, flag: re.Pattern[str] = HEAP_FLAG
) -> int | None:
    """The heap ``vmargs`` state in MiB: the last ``-Xmx`` or ``-XX:MaxHeapSize`` (the JVM takes
    the last), else ``-XX:MaxRAMPercentage`` of ``memory_bytes`` where that is given."""
    found = flag.findall(vmargs)
    if found:
        number, unit = found[-1]
        scale = {"": 1 / MIB, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit.lower()]
        return int(int(number) * scale)
    percentages = RAM_PERCENTAGE_FLAG.findall(vmargs) if flag is HEAP_FLAG else []
    if percentages and memory_bytes is not None:
        return int(memory_bytes * float(percentages[-1]) / 100 // MIB)
    return None


def heap_stated(vmargs: str) -> bool:
    return bool(HEAP_FLAG.search(vmargs) or RAM_PERCENTAGE_FLAG.search(vmargs))


class StatedError(ValueError):
    """A stated setting that cannot run as stated; the message says what would."""


@dataclass(frozen=True)
class DeviceLoad:
    """One worker's batch on a GPU, measured at start on the archive's own model."""

    batch_size: int
    device_s: float
    """The batch's forward passes as the worker waits for them (wall time): the GPU's work and
    the worker's own launching of it, which is most of a small or bf16 model's pass."""
    cpu_s: float
    """The rest of the batch's time in the worker: tokenizing, grouping, scoring."""
    gpu_bytes: int
    """Weights and the activations of the largest pass (``max_batch_tokens``), as torch holds them."""
    context_bytes: int
    """The GPU memory besides torch's own: the CUDA context (and what else held the GPU)."""
    kernel_s: float | None = None
    """The GPU's busy time in the batch: its kernels and copies, as the profiler timed them;
    None where the profiler saw none, and the passes' wall time stands for it."""

    @property
    def gpu_s(self) -> float:
        """The GPU's time per batch: its kernels' where measured, else the passes' wall time."""
        return max(self.kernel_s or self.device_s, 1e-9)

    @property
    def busy_workers(self) -> int:
        """Workers per GPU that keep it busy: a worker's cycle is its CPU side and its passes
        (``cpu_s + device_s``), of which the GPU is busy ``gpu_s``, so n workers keep it busy
        once n x gpu_s >= cpu_s + device_s (processes on one GPU take turns)."""
        return max(1, math.ceil((self.cpu_s + max(self.device_s, self.gpu_s)) / self.gpu_s - 1e-9))

    @property
    def worker_gpu_bytes(self) -> int:
        return self.gpu_bytes + self.context_bytes

    @property
    def gpu_texts_per_s(self) -> float:
        """What one GPU drains, however many workers feed it: a batch per ``gpu_s``."""
        return self.batch_size / self.gpu_s

    def timing(self) -> str:
        """How the batch was timed, for the reasons."""
        kernels = (
            f", the GPU busy {self.kernel_s * 1e3:.2f} ms of it (its kernels' time)"
            if self.kernel_s
            else ""
        )
        return (
            f"a batch of {self.batch_size} took {self.device_s * 1e3:.2f} ms in forward passes"
            f"{kernels} and {self.cpu_s * 1e3:.2f} ms of a worker's CPU around them"
        )


def cut_largest(workers: list[int], fits: object) -> list[int]:
    """``workers`` with one taken at a time from the model with the most (the last of them)
    until ``fits(workers)`` or every model has one."""
    workers = list(workers)
    while not fits(workers) and max(workers) > 1:  # type: ignore[operator]
        workers[max(range(len(workers)), key=lambda i: (workers[i], i))] -= 1
    return workers


def cpu_workers(machine: Machine, count: int, stated: int) -> tuple[list[int], list[str]]:
    """The physical cores left after ``stated`` workers, shared out equally among ``count``
    models."""
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
        f"{gpus} GPU(s): {n} worker(s) on each keep it busy: {load.timing()} (measured at "
        f"start): ceil((cpu + passes) / GPU busy)"
        for n, load in zip(per_gpu, loads, strict=True)
    ]
    cores = max(1, math.floor(machine.cores) - FRONTEND_CORES - stated)
    before = list(per_gpu)
    per_gpu = cut_largest(per_gpu, lambda n: gpus * sum(n) <= cores)
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

        def on_one_gpu(counts: list[int]) -> int:
            return sum(
                math.ceil(n / gpus) * load.worker_gpu_bytes
                for n, load in zip(counts, loads, strict=True)
            )

        before = list(workers)
        workers = cut_largest(workers, lambda n: on_one_gpu(n) <= budget)
        sizes = [load.worker_gpu_bytes // MIB for load in loads]
        total_mib = machine.gpu_memory_bytes // MIB
        if workers != before:
            reasons.append(
                f"cut to {workers} worker(s): {sizes} MiB of GPU memory each (weights, the "
                f"largest pass, the CUDA context) must fit in {GPU_MEMORY_SHARE:.0%} of "
                f"{total_mib} MiB per GPU"
            )
        if on_one_gpu(workers) > budget:
            reasons.append(
                f"{sizes} MiB of GPU memory per worker do not fit in {GPU_MEMORY_SHARE:.0%} of "
                f"{total_mib} MiB: the workers may run out of GPU memory"
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
    besides ``stated`` workers the config sets (holding ``stated_bytes``): on GPUs ``gpu_workers``,
    else the cores left shared out equally; then cut until they fit in half of the memory."""
    if loads is not None and machine.gpus:
        workers, reasons = gpu_workers(machine, loads, stated)
    else:
        workers, reasons = cpu_workers(machine, len(worker_bytes), stated)
    budget = machine.memory_bytes * WORKER_MEMORY_SHARE - stated_bytes
    before = list(workers)
    workers = cut_largest(
        workers, lambda n: sum(a * b for a, b in zip(n, worker_bytes, strict=True)) <= budget
    )
    if workers != before:
        reasons.append(
            f"cut to {workers} worker(s): {[size // MIB for size in worker_bytes]} MiB each "
            f"must fit in half of {machine.memory_bytes // MIB} MiB"
        )
    return workers, reasons


def workers_for(
    machine: Machine, worker_bytes: int, load: DeviceLoad | None = None
) -> tuple[int, list[str]]:
    """Workers for one model (``shared_workers`` of one)."""
    (workers,), reasons = shared_workers(
        machine, [worker_bytes], loads=None if load is None else [load]
    )
    return workers, reasons


def threads_for(machine: Machine, workers: int) -> int:
    """On a CPU, the logical CPUs paid for shared among the workers, at least one torch thread
    each (a 2-CPU pod on both hyperthreads of one core: 1 worker x 2 threads). On GPUs, one."""
    return 1 if machine.gpus else max(1, math.floor(machine.logical_cpus) // workers)


def handler_body_bytes(
    max_chars: int = DEFAULT_MAX_CHARS, max_texts: int = DEFAULT_MAX_TEXTS
) -> int:
    """The largest body the handler accepts: a list of ``max_texts`` texts of ``max_chars``
    characters, each JSON-escaped at worst, and the JSON around them."""
    return max_texts * max_chars * JSON_ESCAPED_MAX_BYTES + REQUEST_OVERHEAD_BYTES


def queued_request_bytes(
    max_request_bytes: int, max_chars: int = DEFAULT_MAX_CHARS, max_texts: int = DEFAULT_MAX_TEXTS
) -> int:
    """What one queued request may hold in the frontend's heap: the largest body the frontend
    admits (``max_request_size``) and the handler accepts, lists included."""
    return min(max_request_bytes, handler_body_bytes(max_chars, max_texts)) + REQUEST_OVERHEAD_BYTES


def heap_room_mib(machine: Machine, reserved_bytes: int) -> int:
    """The largest heap the memory leaves beside ``reserved_bytes`` (the workers) and the JVM's
    non-heap memory, under the compressed-pointer limit; never under ``BASE_HEAP_MIB``."""
    room = (machine.memory_bytes - reserved_bytes - FRONTEND_NON_HEAP_BYTES) // MIB
    return int(max(BASE_HEAP_MIB, min(COMPRESSED_OOPS_MIB, room)))


@dataclass(frozen=True)
class QueueInputs:
    """What the queue and the heap follow from."""

    workers: int
    texts_per_s: float
    """One worker's measured rate (or, capped by a GPU, the drain per worker)."""
    request_bytes: int
    queues: int = 1
    reserved_bytes: int = 0
    stated_queue: int | None = None
    stated_heap_mib: int | None = None
    min_heap_mib: int | None = None
    """A heap floor the config states (``-Xms``): a derived heap is never under it."""


def derive(machine: Machine, given: QueueInputs) -> tuple[int, int, list[str]]:
    """(job_queue_size, heap MiB, why): a patient minute of the workers' drain, in a heap that
    holds ``queues`` such queues of requests of ``request_bytes`` beside ``reserved_bytes`` of
    workers. A stated queue or heap is kept and the other follows from it; a heap, stated or
    what the memory leaves, that holds fewer requests than there are workers is refused
    (``StatedError``): that queue would turn away most of what the workers could take."""
    request_mib = given.request_bytes / MIB
    shown_request = f"{given.request_bytes // 1024} KiB"
    queues = given.queues
    if given.stated_queue is not None:
        queue = given.stated_queue
        reasons = [f"queue {queue} requests: stated"]
    else:
        queue = max(1, int(given.texts_per_s * given.workers * PATIENT_S))
        reasons = [
            f"queue {queue} requests: {given.workers} worker(s) x {given.texts_per_s:g} texts/s "
            f"drain that many one-text requests in {PATIENT_S:.0f} s"
        ]
    if given.stated_heap_mib is not None:
        heap_mib = given.stated_heap_mib
        fits = int((heap_mib - BASE_HEAP_MIB) / request_mib / queues)
        least = max(1, given.workers)
        if fits < least:
            needed = BASE_HEAP_MIB + math.ceil(least * queues * request_mib)
            raise StatedError(
                f"a heap of {heap_mib} MiB is stated: past the frontend's own {BASE_HEAP_MIB} MiB "
                f"it holds {max(fits, 0)} request(s) of {shown_request} (max_request_size), fewer "
                f"than the {least} worker(s) take at once; state at least {needed} MiB, a "
                "smaller max_request_size, or no heap"
            )
        reasons.append(f"heap {heap_mib} MiB: stated")
        if given.stated_queue is None and queue > fits:
            queue = fits
            reasons.append(
                f"queue cut to {queue}: what the stated heap holds over {BASE_HEAP_MIB} MiB, "
                f"{queues} queue(s) of requests of up to {shown_request}"
            )
        return queue, heap_mib, reasons
    room_mib = heap_room_mib(machine, given.reserved_bytes)
    shown = "the queue" if queues == 1 else f"{queues} queues (one per model)"
    heap_mib = int(BASE_HEAP_MIB + math.ceil(queues * queue * request_mib))
    if heap_mib <= room_mib:
        reasons.append(
            f"heap {heap_mib} MiB: {BASE_HEAP_MIB} MiB + {shown} of requests of up to "
            f"{shown_request} (the largest body the frontend admits and the handler accepts)"
        )
    else:
        heap_mib = room_mib
        limit = (
            f"the compressed-pointer limit ({COMPRESSED_OOPS_MIB} MiB)"
            if room_mib == COMPRESSED_OOPS_MIB
            else f"what {machine.memory_bytes // MIB} MiB leaves beside the workers and the JVM"
        )
        if given.stated_queue is not None:
            reasons.append(
                f"heap {heap_mib} MiB: {limit}; it holds fewer than the stated queue of "
                f"requests of up to {shown_request}"
            )
        else:
            queue = int((heap_mib - BASE_HEAP_MIB) / request_mib / queues)
            if queue < max(1, given.workers):
                raise StatedError(
                    f"the workers' {given.reserved_bytes // MIB} MiB leave a heap of {heap_mib} "
                    f"MiB ({limit}): past the frontend's own {BASE_HEAP_MIB} MiB it holds "
                    f"{queue} request(s) of {shown_request} (max_request_size) per model, fewer "
                    f"than a model's {given.workers} worker(s) take at once; state more memory, "
                    "fewer workers or models, a smaller max_request_size, or a queue"
                )
            reasons.append(
                f"queue cut to {queue}: a heap of {heap_mib} MiB ({limit}) holds {shown} of "
                f"that many requests of up to {shown_request}"
            )
    if given.min_heap_mib is not None and heap_mib < given.min_heap_mib:
        heap_mib = given.min_heap_mib
        reasons.append(f"heap {heap_mib} MiB: the stated -Xms, which -Xmx may not be under")
    return queue, heap_mib, reasons


def best_rates(samples: dict[int, list[float]]) -> dict[int, float]:
    """Each batch size's best texts/s of its rounds: what the machine does unhindered. A round
    runs slower only when something else takes the core (another process, the VM's host), never
    faster, so the best round is the one least disturbed (the rule of Python's ``timeit``)."""
    return {size: round(max(rates), 1) for size, rates in samples.items()}


def batch_size_for(rates: dict[int, float]) -> tuple[int, str]:
    """The smallest batch size within ``NEAR_BEST`` of the best rate, and why."""
    best = max(rates.values())
    chosen = min(size for size, rate in rates.items() if rate >= NEAR_BEST * best)
    measured = ", ".join(f"{rate} at {size}" for size, rate in rates.items())
    return chosen, (
        f"batchSize {chosen}: the smallest within {1 - NEAR_BEST:.0%} of the best of one "
        f"worker's texts/s, the best of its rounds ({measured})"
    )
