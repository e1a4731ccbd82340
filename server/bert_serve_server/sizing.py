"""Serving settings for every value config/config.properties leaves out (or marks
``sizedAtStart``: ``served.sized_at_start``): each model's workers and ``batchSize``,
``job_queue_size``, the JVM heap and the torch threads per worker.

The stages, each in its own module:

- ``machine``: the CPUs paid for, the physical cores under them, the memory, the GPUs;
- ``stated``: what the deployment states in environment variables (and ``plan``: a saved plan);
- ``measure``: one worker of each archive, measured in a child process (its memory after loading
  and its largest batch; its texts/s at each batch size, the best of rounds);
- ``rules``: the pure rules from those to workers, threads, ``batchSize``, queue and heap;
- here: the resolution of several models in one config, and ``Resolved``, the plan with its
  reasons; ``size_cli``: the image's command line.

The rule, in the order it is applied:

- **Workers**: on a CPU, one per physical core (``rules.cpu_workers``), so batches run side by
  side; the torch threads of each are the CPUs paid for shared among them
  (``rules.threads_for``). Capped so that the workers' memory, as measured (the peak resident
  set of one worker after loading, its largest forward pass and holding and tokenizing the
  largest batch the limits admit, at the threads the plan gives it: ``measure.Probe``,
  ``workers_at_their_threads``), fits in half of the memory; the heap gets the rest. On GPUs: as many per GPU as keep it busy, measured (``rules.gpu_workers``).
  A model that states ``maxWorkers`` alone gets no more than that.
- **Several models** (each version of a name counts as one): the cores left after the workers
  the config states are shared out equally; the memory cap takes one worker at a time from the
  model with the most.
- **Batch size**: the smallest whose measured rate (the best of ``measure.ROUNDS`` rounds) is
  within ``rules.NEAR_BEST`` of the best of ``rules.BATCH_SIZES``.
- **Queue** (requests): what the workers drain in ``rules.PATIENT_S`` at that rate, one text a
  request; on a GPU never more than the GPU drains (a batch per the GPU's measured busy time:
  its kernels, timed by the profiler, else the pass's wall time).
  TorchServe has one size for every model's queue: with several models, the largest.
- **Heap**: ``rules.BASE_HEAP_MIB`` plus each model's queue of requests of the largest body the
  frontend admits and the handler accepts (``max_request_size``, lists included; set to the
  handler's largest body where the config states none), each as the JVM's collector holds it
  (``rules.heap_request_bytes``; the collector is stated with the heap), within what the memory
  leaves beside the workers, the JVM's non-heap memory and ``rules.SERVER_SLACK_BYTES``; where
  that binds, the queue is cut to what the heap holds; where it holds fewer requests than the workers take at once (workers stated, or
  several models' workers, beyond what the memory leaves), the start is refused with the reason.
- **Stated settings win, the others follow them**: a stated queue gets a heap that holds it; a
  stated heap gets a queue cut to what it holds (a heap that holds fewer requests than there are
  workers is refused with the heap that would); a stated ``-Xms`` is a floor for a derived heap.

A model whose archive cannot be read or whose model cannot be loaded for measuring is left out
(``Resolved.refused``, with the reason): the others are served.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bert_serve_server import measure, rules, served
from bert_serve_server.config import without as without_models
from bert_serve_server.machine import Machine, gpu_count, read_machine, serving_gpus
from bert_serve_server.measure import (
    holds_a_model,
    measured_device_load,
    measured_rates,
)
from bert_serve_server.plan import planned_properties
from bert_serve_server.rules import (
    BATCH_SIZES,
    GPU_WORKER_HOST_BYTES,
    MIN_HEAP_FLAG,
    PATIENT_S,
    DeviceLoad,
    QueueInputs,
    StatedError,
    batch_size_for,
    derive,
    heap_mib_in,
    heap_stated,
    queued_request_bytes,
    threads_for,
    workers_for,
)
from bert_serve_server.served import (
    Served,
    archive_limits,
    runs_on_gpu,
    served_list,
    sized_at_start,
    with_workers,
    worker_host_bytes,
)
from bert_serve_server.stated import Stated, with_stated

__all__ = [
    "BATCH_SIZES", "GPU_WORKER_HOST_BYTES", "PATIENT_S", "DeviceLoad", "Machine", "Resolved",
    "StatedError", "batch_size_for", "derive", "gpu_count", "read_machine", "report", "resolve",
    "serving_gpus", "threads_for", "workers_for",
]  # fmt: skip

DEFAULT_MAX_REQUEST_BYTES = 6_553_500
"""TorchServe 0.12's own ``max_request_size``."""
INFERENCE_ADDRESS_ENV = "BERT_SERVE_INFERENCE_ADDRESS"
"""Where the image's TorchServe serves inference instead of the baked config's 0.0.0.0: the
Kubernetes Deployment sets ``http://127.0.0.1:8080``, so only its proxy sidecar reaches it;
KServe's runtime, which has no sidecar, leaves it unset."""


@dataclass(frozen=True)
class Resolved:
    """The plan: the config with every derived value filled in, and why."""

    properties: dict[str, str]
    torch_threads: int
    reasons: tuple[str, ...]
    refused: dict[str, str] = field(default_factory=dict)
    """``NAME:VERSION`` -> why that model is left out of ``properties``."""
    device_loads: dict[str, DeviceLoad] = field(default_factory=dict)
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``NAME:VERSION`` -> what the start measured of it (texts/s by batch size, memory)."""


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


def each_model(
    models: list[Served], refused: dict[str, str], step: Callable[[Served], Served]
) -> list[Served]:
    """``step`` applied to each model; a model whose own code fails there is added to
    ``refused`` and the others are kept."""
    kept = []
    for model in models:
        try:
            kept.append(step(model))
        except StatedError:
            raise
        except Exception as error:  # the model's own code failed: leave it out, serve the rest
            refused[model.key] = f"{type(error).__name__}: {error}"
    return kept


def resolve(
    properties: dict[str, str], gpus: int | None = None, stated: Stated | None = None
) -> Resolved:
    """``properties`` with what they leave out derived from this machine: each model's
    workers and ``batchSize`` (``models=``), ``job_queue_size`` and the heap (``-Xmx`` in
    ``vmargs``); and the torch threads per worker. Values the config or ``stated`` state are
    kept, and nothing is measured that they decide. A model whose archive cannot be read or
    loaded is left out, with the reason (``refused``)."""
    stated = stated or Stated()
    properties, plain_start = sized_at_start(properties)
    properties, stated_threads, planned = with_plan_of(properties, stated)
    if gpus is None:
        gpus = serving_gpus(properties)
    machine, properties = with_stated(read_machine(gpus), properties, stated)
    models = served_list(properties)
    refused = {m.key: f"{m.mar} is missing" for m in models if not m.mar.is_file()}
    on_gpu = gpu_models(machine, models, refused)
    models = [model for model in models if model.key not in refused]
    if not on_gpu:
        machine = replace(machine, gpus=0)  # every model on the CPU: sized as on a CPU machine
    workers_sized = {model.key for model in models if "minWorkers" not in model.entry}
    reasons: list[str] = [*machine.source, *stated.lines(), *plain_start, *planned]
    stated_queue = int(properties["job_queue_size"]) if "job_queue_size" in properties else None

    def batches(models: list[Served], threads: int) -> BatchSized:
        return batch_sized(models, threads, machine, stated_queue is None, refused)

    threads = stated_threads or 1
    probe = memory_probe(machine, properties, models, stated_threads or 1)
    if models and not on_gpu:
        batched, threads, why = cpu_sized(machine, models, refused, stated_threads, batches, probe)
        reasons += why
    else:
        batched = batches(models, threads)
    sized, rates = batched.models, batched.rates
    loads: dict[str, DeviceLoad] = {}
    if on_gpu:
        sized, loads = with_device_loads(sized, on_gpu, refused, stated_queue is None)
        if sized:
            with measure.probing(probe):
                sized, threads, why = with_workers(machine, sized, loads, on_gpu, stated_threads)
            reasons += why
    reasons += batched.reasons
    resolved = dict(properties)
    holding = [model for model in sized if holds_a_model(model.mar)]
    with measure.probing(replace(probe, threads=threads)):  # the workers as measured above
        if holding and (any(rates.get(m.key) for m in sized) or stated_queue is not None):
            why, resolved = sized_queue(
                machine, resolved, sized, rates, loads, on_gpu, stated_queue
            )
            reasons += why
        measured = measured_of(sized, rates, workers_sized, on_gpu)
    models_entry: dict[str, dict[str, Any]] = {}
    for model in sized:
        models_entry.setdefault(model.name, {})[model.version] = model.entry
    resolved["models"] = json.dumps(models_entry)
    if refused:
        resolved = without_models(resolved, refused)
    return Resolved(resolved, threads, tuple(reasons), refused, loads, measured)


def measured_of(
    models: list[Served],
    rates: dict[str, float | None],
    workers_sized: set[str],
    on_gpu: frozenset[str],
) -> dict[str, dict[str, Any]]:
    """What was measured of each model: its rate at its batch size, and a worker's memory
    where the start sized its workers (both as measured once, nothing measured again)."""
    measured: dict[str, dict[str, Any]] = {}
    for model in models:
        got: dict[str, Any] = {}
        if rates.get(model.key) is not None:
            got["texts_per_s"] = rates[model.key]
        if model.key in workers_sized:
            got["worker_bytes"], got["worker_bytes_source"] = worker_host_bytes(model, on_gpu)
        if got:
            measured[model.key] = got
    return measured


def with_plan_of(
    properties: dict[str, str], stated: Stated
) -> tuple[dict[str, str], int | None, list[str]]:
    """The config with the stated plan in it (if any), the torch threads stated (the
    environment's, else the plan's), and the notes."""
    if stated.plan is None:
        served_list(properties)  # a config without models is refused before the machine is read
        return properties, stated.threads, []
    archives = {m.key: m.mar.stat().st_size for m in served_list(properties) if m.mar.is_file()}
    properties, threads, notes = planned_properties(properties, stated.plan, archives)
    return properties, stated.threads or threads, notes


def memory_probe(
    machine: Machine, properties: dict[str, str], models: list[Served], threads: int
) -> measure.Probe:
    """What a worker's memory is measured with (``measure.Probe``): ``threads``, each model's
    largest batch (its stated ``batchSize``, else the largest the start chooses), the config's
    ``max_request_size`` (else the handler's largest body, which the start then sets), and the
    most a worker may hold here: the memory less the frontend's least (its non-heap memory, its
    own heap) and the slack."""
    stated = properties.get("max_request_size")
    least_beside = (
        rules.FRONTEND_NON_HEAP_BYTES + rules.SERVER_SLACK_BYTES + rules.BASE_HEAP_MIB * rules.MIB
    )
    return measure.Probe(
        threads=threads,
        batch_sizes=tuple(
            (str(m.mar), int(m.entry["batchSize"])) for m in models if "batchSize" in m.entry
        ),
        max_request_bytes=int(stated) if stated else None,
        cap_bytes=max(0, machine.memory_bytes - least_beside),
    )


def workers_at_their_threads(
    machine: Machine, models: list[Served], stated_threads: int | None, probe: measure.Probe
) -> tuple[list[Served], int, list[str]]:
    """``with_workers`` with each worker's memory measured at the torch threads the plan gives
    it: first at the CPUs paid for shared one worker per core; where the memory then cuts the
    workers (so each gets more threads), measured again at those, until the two agree."""
    guess = stated_threads or threads_for(machine, max(1, math.floor(machine.cores)))
    tried: set[int] = set()
    while True:
        with measure.probing(replace(probe, threads=guess)):
            sized, threads, why = with_workers(machine, models, stated_threads=stated_threads)
            if any("minWorkers" not in model.entry for model in models):  # memory measured
                why += largest_batch_reasons(sized, guess)
        tried.add(guess)
        if threads == guess or threads in tried:
            return sized, threads, why
        guess = threads


def largest_batch_reasons(models: list[Served], threads: int) -> list[str]:
    """What the largest batch added to each worker ``with_workers`` measured (``models``: those
    it measured), and the threads it was measured with (read again, nothing measured twice)."""
    # served's own reader: the one with_workers measured with (a test replaces it there)
    measured_memory = getattr(served, "measured_memory")  # noqa: B009
    reasons = []
    for model in models:
        if not holds_a_model(model.mar):
            continue
        memory = measured_memory(str(model.mar), model.mar.stat().st_mtime_ns)
        batch = getattr(memory, "batch", "")
        if batch.startswith(measure.NOT_MEASURED):
            reasons.append(
                f"{model.key}: WARNING: the largest batch the limits admit is not within a "
                f"worker's budget, {batch}"
            )
        elif batch:
            reasons.append(
                f"{model.key}: a worker measured with {threads} torch thread(s), as the plan "
                f"gives each; the largest batch the limits admit ({memory.batch}) added "
                f"{memory.batch_bytes // rules.MIB} MiB to its peak of "
                f"{memory.peak_bytes // rules.MIB} MiB, decoded and tokenized in "
                f"{memory.batch_s:g} s"
            )
    return reasons


def cpu_workers_or_refused(
    machine: Machine,
    models: list[Served],
    refused: dict[str, str],
    threads: int | None,
    probe: measure.Probe,
) -> tuple[list[Served], int, list[str]]:
    """``with_workers`` on the CPU (``workers_at_their_threads``); where measuring a worker's
    memory fails (the model's own code), that model is refused and the others sized without it."""
    while models:
        try:
            return workers_at_their_threads(machine, models, threads, probe)
        except measure.MeasureError as error:
            refused[error.key] = str(error)
            models = [model for model in models if model.key != error.key]
    return [], threads or 1, []


@dataclass
class BatchSized:
    """The models with their batch sizes, each one's rate there, and why."""

    models: list[Served]
    rates: dict[str, float | None] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def batch_sized(
    models: list[Served],
    threads: int,
    machine: Machine,
    measure_queue: bool,
    refused: dict[str, str],
) -> BatchSized:
    """``with_batch_size`` of each model; one whose own code fails is added to ``refused``."""
    batched = BatchSized([])

    def step(model: Served) -> Served:
        sized, rate, why = with_batch_size(model, threads, machine, measure_queue)
        label = f"{model.key}: " if len(models) > 1 else ""
        batched.reasons.extend(label + reason for reason in why)
        batched.rates[model.key] = rate
        return sized

    batched.models = each_model(models, refused, step)
    return batched


def cpu_sized(
    machine: Machine,
    models: list[Served],
    refused: dict[str, str],
    stated_threads: int | None,
    batches: Callable[[list[Served], int], BatchSized],
    probe: measure.Probe,
) -> tuple[BatchSized, int, list[str]]:
    """On the CPU: the workers and threads (``cpu_workers_or_refused``), then each model's batch
    size (``batches``); a model refused while its rate is measured gives its cores back, the
    workers sized again without it."""
    while True:
        workers, threads, why = cpu_workers_or_refused(
            machine, models, refused, stated_threads, probe
        )
        batched = batches(workers, threads)
        if len(batched.models) == len(workers):
            return batched, threads, why
        models = [model for model in models if model.key not in refused]


def sized_queue(
    machine: Machine,
    properties: dict[str, str],
    models: list[Served],
    rates: dict[str, float | None],
    loads: dict[str, DeviceLoad],
    on_gpu: frozenset[str],
    stated_queue: int | None,
) -> tuple[list[str], dict[str, str]]:
    """``job_queue_size``, ``max_request_size`` and ``-Xmx`` for ``models`` (``rules.derive``),
    with the reasons; a stated ``-Xms`` is a floor for the heap."""
    properties = dict(properties)
    vmargs = properties.get("vmargs", "")
    reasons = []
    holding = [model for model in models if holds_a_model(model.mar)]
    limits = [archive_limits(m.mar) for m in holding]
    largest_body = max(rules.handler_body_bytes(chars, texts) for chars, texts in limits)
    if "max_request_size" in properties:
        max_request = int(properties["max_request_size"])
    else:
        max_request = largest_body
        properties["max_request_size"] = str(max_request)
        reasons.append(
            f"max_request_size {max_request}: the largest body the handler accepts "
            "(max_texts_per_request texts of max_chars characters, JSON-escaped)"
        )
    (workers, rate), why_drain = gpu_capped_drains(machine, models, rates, loads)
    reasons += why_drain
    reserved = 0
    if not heap_stated(vmargs):
        reserved = sum(int(m.entry["minWorkers"]) * worker_host_bytes(m, on_gpu)[0] for m in models)
    gc = rules.jvm_gc(machine, vmargs)
    queue, heap_mib, why = derive(
        machine,
        QueueInputs(
            workers=max(workers, 1),
            texts_per_s=rate,
            request_bytes=max(queued_request_bytes(max_request, *lim) for lim in limits),
            queues=len(holding),
            reserved_bytes=reserved,
            stated_queue=stated_queue,
            stated_heap_mib=heap_mib_in(vmargs, machine.memory_bytes),
            min_heap_mib=heap_mib_in(vmargs, flag=MIN_HEAP_FLAG),
            gc=gc,
            vmargs=vmargs,
        ),
    )
    least = heap_mib_in(vmargs, flag=MIN_HEAP_FLAG)
    stated_heap = heap_mib_in(vmargs, machine.memory_bytes)
    if least is not None and stated_heap is not None and stated_heap < least:
        raise StatedError(
            f"-Xms{least}m is more than the stated heap of {stated_heap} MiB: the JVM refuses to start"
        )
    properties["job_queue_size"] = str(queue)
    if not heap_stated(vmargs):
        pinned = ""
        if gc in rules.GC_FLAG_OF and rules.gc_flag_in(vmargs) is None:
            # The heap holds the queue as this collector holds it: the JVM runs that one even
            # where it sees another machine than the one sized (a stated memory, a CPU request).
            pinned = f" {rules.GC_FLAG_OF[gc]}"
            why.append(
                f"{rules.GC_FLAG_OF[gc]}: the collector the JVM picks on "
                f"{machine.logical_cpus:g} CPUs and {machine.memory_bytes // rules.MIB} MiB "
                f"(G1 from 2 CPUs and {rules.SERVER_CLASS_MEMORY_BYTES // rules.MIB} MiB), "
                "stated so that it is the one the heap was sized for"
            )
        properties["vmargs"] = f"{vmargs}{pinned} -Xmx{heap_mib}m".strip()
    return reasons + why, properties


def gpu_capped_drains(
    machine: Machine,
    models: list[Served],
    rates: dict[str, float | None],
    loads: dict[str, DeviceLoad],
) -> tuple[tuple[int, float], list[str]]:
    """The largest drain among ``models`` as (workers, texts/s per worker), each model's
    workers x rate capped by what its GPUs drain (a batch per measured device time), and
    the reasons where a GPU capped it."""
    drains, reasons = [], []
    for model in models:
        rate = rates.get(model.key)
        if rate is None:
            continue
        workers = int(model.entry["minWorkers"])
        load = loads.get(model.key)
        if load is not None and workers * rate > machine.gpus * load.gpu_texts_per_s:
            drained = machine.gpus * load.gpu_texts_per_s
            reasons.append(
                f"{model.key}: the queue follows what {machine.gpus} GPU(s) drain, "
                f"{drained:.1f} texts/s (a batch of {load.batch_size} per "
                f"{load.gpu_s * 1e3:.2f} ms of the GPU), less than {workers} x {rate:g}"
            )
            rate = drained / workers
        drains.append((workers, rate))
    return max(drains or [(0, 0.0)], key=lambda drain: drain[0] * drain[1]), reasons


def with_device_loads(
    models: list[Served], on_gpu: frozenset[str], refused: dict[str, str], need_queue: bool = True
) -> tuple[list[Served], dict[str, DeviceLoad]]:
    """The models still served, and the ``DeviceLoad`` at its batch size of each whose GPU
    workers the start sizes or whose queue the GPU caps (on a GPU, a model in the archive); a
    model whose measurement fails is added to ``refused``."""
    kept, loads = [], {}
    for model in models:
        sizes_workers = "minWorkers" not in model.entry
        if model.key in on_gpu and holds_a_model(model.mar) and (sizes_workers or need_queue):
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


def report(resolved: Resolved) -> dict[str, Any]:
    """What ``make status`` and the start-up output show: the values in force and why."""
    return {
        "models": json.loads(resolved.properties["models"]),
        "refused": dict(resolved.refused),
        "job_queue_size": resolved.properties.get("job_queue_size"),
        "max_request_size": resolved.properties.get("max_request_size"),
        "vmargs": resolved.properties.get("vmargs", ""),
        "torch_threads": resolved.torch_threads,
        "device_loads": {key: asdict(load) for key, load in resolved.device_loads.items()},
        "measured": resolved.measured,
        "why": list(resolved.reasons),
    }
