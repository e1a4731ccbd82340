"""The sizing rules as pure functions: from a ``Machine`` (what ``bert_serve_server.probe`` reads
of it, or what is stated) and what was measured (``DeviceLoad``, a worker's memory) to workers,
torch threads, ``batchSize``, the queue and the heap, each with its reasons. Nothing here reads
the machine, a file or the clock (``bert_serve_server.sizing`` has the whole rule).

Units: ``*_bytes`` are bytes, ``*_mib`` are MiB (2**20 bytes); TorchServe's ``job_queue_size``
counts requests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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
JSON_ESCAPED_MAX_BYTES = 12
"""The most bytes one character of a text takes in a body: a character past U+FFFF is two UTF-16
surrogates in JSON, each escaped (``\\ud83d\\ude00``), or four UTF-8 bytes each percent-encoded
in a form (``%F0%9F%98%80``); every other character takes 6 or fewer."""
TEXTS_PER_ITEM = 2
"""An item of a list may be a pair (``{"text": ..., "text_pair": ...}``), each of up to
``max_chars`` characters."""
ITEM_FRAMING_BYTES = 64
"""The JSON around one item of a list: ``{"text": "", "text_pair": ""}, `` and its spaces."""
REQUEST_OVERHEAD_BYTES = 4096
"""A queued request besides its body: the frontend's job, its headers and the JSON around the
texts."""
SERVER_SLACK_BYTES = 128 * MIB
"""Memory left unplanned beside the workers, the heap and the JVM's non-heap memory: the processes
the container runs beside TorchServe's own, charged to its memory limit too. TorchServe's Python
launcher (14 MiB RSS in deploy/image-test.json) and the entrypoint's shell (2 MiB); the probes,
each a ``python -m bert_serve_server ready`` (about 21 MiB RSS), readiness and liveness at once
and, while stopping, the drain and ``torchserve --stop`` beside them: about 100 MiB at most,
rounded up. A fixed floor, not a share of the memory: these are the same few processes on any
machine, and what grows with the memory (the workers, the heap) is budgeted on its own
(tests/unit/test_sizing_limits.py holds the Deployment's plan under its limit by this much)."""
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
CGROUP_LIMIT = "the cgroup limit"
PHYSICAL = "the physical memory"
STATED = "the stated BERT_SERVE_MEMORY"
"""The bounds on the memory, as the reasons name them (``Machine.memory_bounds``)."""


@dataclass(frozen=True)
class Machine:
    """The machine sized for: as ``probe.read_machine`` reads it, or as it is stated
    (``sizing.with_stated``)."""

    cores: float
    """Physical cores this process may use (never more than ``cpus``)."""
    memory_bytes: int
    gpus: int
    gpu_memory_bytes: int = 0
    """The smallest of the GPUs' memories (0: no GPU, or not known)."""
    cpus: float = 0.0
    """Logical CPUs paid for (hyperthreads counted); 0: as many as ``cores``."""
    cpu_source: str = ""
    """How the CPUs were read, for the reasons."""
    memory_bounds: tuple[tuple[str, int], ...] = ()
    """Each bound on the memory that was known (``CGROUP_LIMIT``, ``PHYSICAL``, ``STATED``) and
    its bytes; ``memory_bytes`` is the least of them."""

    @property
    def logical_cpus(self) -> float:
        return self.cpus or self.cores

    @property
    def source(self) -> tuple[str, ...]:
        """How each value was read or stated, for the reasons."""
        lines = [f"machine: {self.cpu_source}"] if self.cpu_source else []
        if self.memory_bounds:
            lines.append(f"machine: {memory_line(self.memory_bounds)}")
        return tuple(lines)


def least_memory(bounds: tuple[tuple[str, int], ...]) -> tuple[str, int]:
    """The bound that binds: the least (the first of equal ones)."""
    return min(bounds, key=lambda bound: bound[1])


def memory_line(bounds: tuple[tuple[str, int], ...]) -> str:
    """The memory sized for, the bound that set it, and the others beside it."""
    name, least = least_memory(bounds)
    others = [f"{other} {size // 2**20} MiB" for other, size in bounds if other != name]
    if not any(other == CGROUP_LIMIT for other, _ in bounds):
        others.append("no cgroup limit")
    line = f"{least // 2**20} MiB of memory, bound by {name}"
    line += f" ({', '.join(others)})" if others else ""
    if name == PHYSICAL and len(others) == 1 and others[0] == "no cgroup limit":
        line += (
            ": a pod without a memory limit is sized for its node's memory unless it states its "
            "request in BERT_SERVE_MEMORY"
        )
    return line


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


class SizingError(ValueError):
    """A config, or a stated value, that cannot be sized; the message says why and what to change."""


class StatedError(SizingError):
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
    """The largest body the handler accepts: a list of ``max_texts`` items, each a pair of texts
    of ``max_chars`` characters, every character escaped at its longest (a character past
    U+FFFF), and the JSON around them."""
    item = TEXTS_PER_ITEM * max_chars * JSON_ESCAPED_MAX_BYTES + ITEM_FRAMING_BYTES
    return max_texts * item + REQUEST_OVERHEAD_BYTES


def queued_request_bytes(
    max_request_bytes: int, max_chars: int = DEFAULT_MAX_CHARS, max_texts: int = DEFAULT_MAX_TEXTS
) -> int:
    """What one queued request may hold in the frontend's heap: the largest body the frontend
    admits (``max_request_size``) and the handler accepts, lists included."""
    return min(max_request_bytes, handler_body_bytes(max_chars, max_texts)) + REQUEST_OVERHEAD_BYTES


def heap_room_mib(machine: Machine, reserved_bytes: int) -> int:
    """The largest heap the memory leaves beside ``reserved_bytes`` (the workers), the JVM's
    non-heap memory and ``SERVER_SLACK_BYTES``, under the compressed-pointer limit; never under
    ``BASE_HEAP_MIB``."""
    room = (
        machine.memory_bytes - reserved_bytes - FRONTEND_NON_HEAP_BYTES - SERVER_SLACK_BYTES
    ) // MIB
    return int(max(BASE_HEAP_MIB, min(COMPRESSED_OOPS_MIB, room)))


SERIAL, G1 = "serial", "g1"
GC_FLAGS = {
    "-XX:+UseSerialGC": SERIAL,
    "-XX:+UseG1GC": G1,
    "-XX:+UseParallelGC": "parallel",
    "-XX:+UseZGC": "z",
    "-XX:+UseShenandoahGC": "shenandoah",
}
GC_FLAG_OF = {SERIAL: "-XX:+UseSerialGC", G1: "-XX:+UseG1GC"}
SERVER_CLASS_MEMORY_BYTES = 2 * 2**30 - 256 * MIB
"""HotSpot's server-class machine (``os::is_server_class_machine``): 2 or more CPUs and 2 GiB
less 256 MiB of memory (in a container, its limit). There the JVM picks G1, elsewhere Serial."""
G1_TARGET_REGIONS = 2048
G1_MIN_REGION, G1_MAX_REGION = MIB, 32 * MIB
ARRAY_HEADER_BYTES = 16
"""A Java ``byte[]``'s header (compressed class pointers): a body of B bytes is an array of B + 16."""
G1_REGION_FLAG = re.compile(r"-XX:G1HeapRegionSize=(\d+)([kKmMgG]?)(?=\s|$)")


def gc_flag_in(vmargs: str) -> str | None:
    """The last collector flag of ``vmargs`` (the JVM takes the last), if any."""
    chosen = [flag for flag in vmargs.split() if flag in GC_FLAGS]
    return chosen[-1] if chosen else None


def jvm_gc(machine: Machine, vmargs: str) -> str:
    """The collector the frontend's JVM runs: the last one ``vmargs`` select, else the JVM's own
    choice on this machine (G1 on a server-class machine, else Serial)."""
    flag = gc_flag_in(vmargs)
    if flag is not None:
        return GC_FLAGS[flag]
    server_class = machine.logical_cpus >= 2 and machine.memory_bytes >= SERVER_CLASS_MEMORY_BYTES
    return G1 if server_class else SERIAL


def g1_region_bytes(heap_mib: int, vmargs: str = "") -> int:
    """G1's region size: the stated ``-XX:G1HeapRegionSize``, else the JVM's (17) own: the heap
    over 2048 regions rounded up to a power of two, 1 to 32 MiB (-Xmx3g: 2 MiB, -Xmx4097m: 4 MiB,
    as ``java -XX:+PrintFlagsFinal`` prints them)."""
    stated = G1_REGION_FLAG.findall(vmargs)
    if stated:
        number, unit = stated[-1]
        size = int(number) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit.lower()]
    else:
        size = 1 << max(0, math.ceil(heap_mib * MIB / G1_TARGET_REGIONS) - 1).bit_length()
    return min(G1_MAX_REGION, max(G1_MIN_REGION, size))


def heap_request_bytes(request_bytes: int, gc: str, heap_mib: int, vmargs: str = "") -> int:
    """What one queued request of ``request_bytes`` (its body and ``REQUEST_OVERHEAD_BYTES``)
    takes of the heap: its body is one ``byte[]``. Under G1 an array of more than half a region
    is humongous and takes whole regions (a 1 MiB body in 1 or 2 MiB regions takes 2 MiB), and
    smaller ones pack whole into regions (three 1 MiB bodies to a 4 MiB region); measured with
    OpenJDK 17 holding 1 MiB arrays in a 780 MiB heap: Serial held 749, G1 387 (1 MiB regions)
    and 579 (4 MiB). Under the other collectors, the request as it is (the array's 16-byte
    header within ``REQUEST_OVERHEAD_BYTES``)."""
    if gc != G1:
        return request_bytes
    body = max(0, request_bytes - REQUEST_OVERHEAD_BYTES) + ARRAY_HEADER_BYTES
    region = g1_region_bytes(heap_mib, vmargs)
    if body > region // 2:
        footprint = math.ceil(body / region) * region
    else:
        footprint = math.ceil(region / (region // body))
    return footprint + REQUEST_OVERHEAD_BYTES


def heap_holding(queue_bytes: float, gc: str, request_bytes: int, vmargs: str = "") -> int:
    """The least heap (MiB) past ``BASE_HEAP_MIB`` that holds ``queue_bytes / request_bytes``
    requests as ``heap_request_bytes`` counts them at that heap's own region size."""
    count = queue_bytes / request_bytes
    heap = int(BASE_HEAP_MIB + math.ceil(queue_bytes / MIB))
    for _ in range(8):  # the region size takes a few values: a fixed point in a few steps
        needed = int(
            BASE_HEAP_MIB
            + math.ceil(count * heap_request_bytes(request_bytes, gc, heap, vmargs) / MIB)
        )
        if needed <= heap:
            break
        heap = needed
    return heap


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
    gc: str = SERIAL
    """The frontend's collector (``jvm_gc``): what a request's body takes of the heap."""
    vmargs: str = ""
    """The config's JVM arguments (a stated ``-XX:G1HeapRegionSize``)."""


@dataclass(frozen=True)
class HeapRequests:
    """Requests of ``given`` as a heap holds them (``heap_request_bytes``)."""

    given: QueueInputs

    def taken(self, heap: int) -> int:
        given = self.given
        return heap_request_bytes(given.request_bytes, given.gc, heap, given.vmargs)

    def held(self, heap: int) -> int:
        """Requests of each queue that ``heap`` holds past the frontend's own."""
        return int((heap - BASE_HEAP_MIB) * MIB / self.taken(heap) / self.given.queues)

    def holding(self, requests: int) -> int:
        """The least heap that holds ``requests``."""
        given = self.given
        return heap_holding(
            requests * given.request_bytes, given.gc, given.request_bytes, given.vmargs
        )

    def shown(self, heap: int) -> str:
        given = self.given
        text = f"{given.request_bytes // 1024} KiB"
        if given.gc == G1 and self.taken(heap) > given.request_bytes + ARRAY_HEADER_BYTES:
            region = g1_region_bytes(heap, given.vmargs) // MIB
            text += (
                f", each taking {self.taken(heap) // 1024} KiB of the heap in G1's {region} MiB "
                "regions (a body over half a region takes whole regions, smaller ones pack whole)"
            )
        return text


def with_stated_heap(
    given: QueueInputs, queue: int, reasons: list[str]
) -> tuple[int, int, list[str]]:
    """``derive`` where the heap is stated: the queue cut to what it holds."""
    requests, queues = HeapRequests(given), given.queues
    heap_mib = given.stated_heap_mib
    assert heap_mib is not None
    fits = requests.held(heap_mib)
    least = max(1, given.workers)
    if fits < least:
        raise StatedError(
            f"a heap of {heap_mib} MiB is stated: past the frontend's own {BASE_HEAP_MIB} MiB "
            f"it holds {max(fits, 0)} request(s) of max_request_size, {requests.shown(heap_mib)}, "
            f"fewer than the {least} worker(s) take at once; state at least "
            f"{requests.holding(least * queues)} MiB, a smaller max_request_size, or no heap"
        )
    reasons.append(f"heap {heap_mib} MiB: stated")
    if given.stated_queue is None and queue > fits:
        queue = fits
        reasons.append(
            f"queue cut to {queue}: what the stated heap holds over {BASE_HEAP_MIB} MiB, "
            f"{queues} queue(s) of requests of up to {requests.shown(heap_mib)}"
        )
    return queue, heap_mib, reasons


def derive(machine: Machine, given: QueueInputs) -> tuple[int, int, list[str]]:
    """(job_queue_size, heap MiB, why): a patient minute of the workers' drain, in a heap that
    holds ``queues`` such queues of requests of ``request_bytes`` (each as its body takes the
    heap under ``given.gc``, ``heap_request_bytes``) beside ``reserved_bytes`` of workers. A
    stated queue or heap is kept and the other follows from it; a heap, stated or what the
    memory leaves, that holds fewer requests than there are workers is refused
    (``StatedError``): that queue would turn away most of what the workers could take."""
    queues, requests = given.queues, HeapRequests(given)
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
        return with_stated_heap(given, queue, reasons)
    room_mib = heap_room_mib(machine, given.reserved_bytes)
    queues_shown = "the queue" if queues == 1 else f"{queues} queues (one per model)"
    heap_mib = requests.holding(queues * queue)
    if heap_mib <= room_mib:
        reasons.append(
            f"heap {heap_mib} MiB: {BASE_HEAP_MIB} MiB + {queues_shown} of requests of up to "
            f"{requests.shown(heap_mib)} (the largest body the frontend admits and the handler "
            "accepts)"
        )
    else:
        heap_mib = room_mib
        limit = (
            f"the compressed-pointer limit ({COMPRESSED_OOPS_MIB} MiB)"
            if room_mib == COMPRESSED_OOPS_MIB
            else (
                f"what {machine.memory_bytes // MIB} MiB leaves beside the workers, the JVM's "
                f"non-heap {FRONTEND_NON_HEAP_BYTES // MIB} MiB and "
                f"{SERVER_SLACK_BYTES // MIB} MiB of slack"
            )
        )
        if given.stated_queue is not None:
            reasons.append(
                f"heap {heap_mib} MiB: {limit}; it holds fewer than the stated queue of "
                f"requests of up to {requests.shown(heap_mib)}"
            )
        else:
            queue = requests.held(heap_mib)
            if queue < max(1, given.workers):
                raise StatedError(
                    f"the workers' {given.reserved_bytes // MIB} MiB leave a heap of {heap_mib} "
                    f"MiB ({limit}): past the frontend's own {BASE_HEAP_MIB} MiB it holds "
                    f"{queue} request(s) of max_request_size, {requests.shown(heap_mib)}, per model, "
                    f"fewer than a model's {given.workers} worker(s) take at once; state more "
                    "memory, fewer workers or models, a smaller max_request_size, or a queue"
                )
            reasons.append(
                f"queue cut to {queue}: a heap of {heap_mib} MiB ({limit}) holds {queues_shown} "
                f"of that many requests of up to {requests.shown(heap_mib)}"
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
