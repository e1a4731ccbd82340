"""What the sizing reads of the world: the machine the server starts on, and each archive's own
model measured in a fresh child process (``bert_serve_server.rules`` turns both into a plan).

The machine, as sizing sees it: the CPUs this process is paid for, the physical cores under
them, the memory and the GPUs. Read from sysfs and the cgroup files only (no measurement); every
value may be stated instead (``bert_serve_server.sizing``'s ``BERT_SERVE_*`` variables).

- **CPUs paid for** (``Machine.cpus``, logical CPUs: what a Kubernetes ``cpu`` counts): the CPUs
  of this process's affinity, capped by a cgroup CPU quota (``cpu.max``, ``cpu.cfs_quota_us``);
  with no quota, by the cgroup's CPU request (``cpu.weight`` or ``cpu.shares``, which the
  kubelet sets from the pod's request), so a pod without a limit is sized for what it asked for,
  not for the whole node. The kernel's defaults (weight 100, shares 1024) read as no request.
- **Cores** (``Machine.cores``): the physical cores those CPUs sit on (sysfs ``topology``:
  hyperthreads of one core share its units), never more than the CPUs paid for. Workers follow
  the cores; the torch threads follow the CPUs (``rules.threads_for``).
- **Memory** (``Machine.memory_bytes``): the least of the cgroup's memory limit (the least
  ``memory.max``, or v1 ``memory.limit_in_bytes``, of this process's cgroup and those above it),
  the physical memory, and a stated memory (``BERT_SERVE_MEMORY``, ``sizing.with_stated``): a
  limit larger than the machine (a fake 1 TiB ``memory.max``) is not memory the pod can use, and
  a stated value can only lower what there is. The reasons say which one bound it. A pod with no
  memory limit is sized for the node's memory: state its request (the Downward API's
  ``requests.memory`` in ``BERT_SERVE_MEMORY``).

The model: one worker's texts/s at each batch size, its memory, and on a GPU a batch's device
and CPU time. The rate is measured so that it repeats start after start: every batch size
classifies the same ``SAMPLE_COUNT`` texts (their lengths spread as reviews' are), so each size
sees the same lengths; the sizes are measured in rounds, each round going through every size once, so a
moment of contention on a shared machine falls on all sizes alike; each size's rate is the
best of its rounds (``rules.best_rates``): a round is only ever slowed by what else runs, and a
cloud VM's core runs slower for seconds at a time, so the best round is the machine's own
speed and repeats start after start more closely than the median (docs/configuration.md, "How
much the choice repeats"). A worker's memory is the child's own peak
resident set (``VmHWM``) after loading, its largest forward pass, and holding and tokenizing the
largest batch the limits admit (``largest_bodies``: ``batchSize`` requests of the largest body the
frontend admits and the handler accepts, as the worker holds them, decoded, then the archive's own
``handler.inference.tokenize`` over all their texts, and the largest forward again while they are
held), with its unique and proportional sets (USS, PSS) beside it, in a process of its own
(``measure_memory``), with the torch threads the plan gives a worker (``Probe``): what one more
worker costs the machine, as measured, not estimated.

The child reports each step it finishes (``progress``); one that goes ``timeout_s()`` without
finishing a step (a hung CUDA initialization) is stopped, and so is one whose resident set passes
what the machine can give a worker (``Probe.cap_bytes``), each with a message that says so.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bert_serve_server.config import BASE_CONFIG, read_properties
from bert_serve_server.rules import (
    BATCH_SIZES,
    CGROUP_LIMIT,
    PHYSICAL,
    REQUEST_OVERHEAD_BYTES,
    DeviceLoad,
    Machine,
    best_rates,
    handler_body_bytes,
    least_memory,
)

CGROUP = Path("/sys/fs/cgroup")
CPU_TOPOLOGY = Path("/sys/devices/system/cpu")
DEFAULT_CPU_WEIGHT = 100
"""cgroup v2's ``cpu.weight`` when nothing set it: read as no CPU request."""
DEFAULT_CPU_SHARES = 1024
"""cgroup v1's ``cpu.shares`` when nothing set it: read as no CPU request."""
PROC_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT_BYTES = 2**60
"""cgroup v1 writes "no limit" as a huge number (2**63 less a page); any limit this large is none."""


def cgroup_cores(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (v2 ``cpu.max``, v1 cfs), if any."""
    v2 = root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().partition(" ")
        return None if quota == "max" else int(quota) / int(period)
    v1_quota, v1_period = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
    if v1_quota.is_file() and v1_period.is_file():
        quota_us = int(v1_quota.read_text())
        return None if quota_us <= 0 else quota_us / int(v1_period.read_text())
    return None


def cgroup_cpu_request(root: Path = CGROUP) -> float | None:
    """The CPU request the kubelet wrote into this cgroup, in CPUs, if any: v1 ``cpu.shares``
    are 1024 per CPU; v2 ``cpu.weight`` maps shares as ``1 + (shares - 2) * 9999 / 262142``
    (runc's conversion), inverted here; the conversion loses up to 0.03 CPU, so the request is
    rounded to the nearest 0.05."""
    v2 = root / "cpu.weight"
    if v2.is_file():
        weight = int(v2.read_text())
        if weight == DEFAULT_CPU_WEIGHT:
            return None
        shares = 2 + (weight - 1) * 262142 / 9999
        return round(shares / 1024 * 20) / 20
    v1 = root / "cpu" / "cpu.shares"
    if v1.is_file():
        shares = int(v1.read_text())
        return None if shares == DEFAULT_CPU_SHARES else shares / 1024
    return None


def own_cgroups(proc_cgroup: Path = PROC_CGROUP) -> tuple[str, str]:
    """This process's cgroup paths (v2's unified one, v1's memory controller's), from
    ``/proc/self/cgroup``; "/" where it names none (in a container's own namespace, its root)."""
    unified = memory = "/"
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return unified, memory
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            unified = path or "/"
        elif "memory" in controllers.split(","):
            memory = path or "/"
    return unified, memory


def limit_in(path: Path) -> int | None:
    """The memory limit one cgroup file states, None for none (or no such file)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" or int(text) >= NO_LIMIT_BYTES else int(text)


def cgroup_memory(root: Path = CGROUP, own: tuple[str, str] | None = None) -> int | None:
    """The least memory limit of this process's cgroup and every cgroup above it (each one's
    limit applies), v2 ``memory.max`` or v1 ``memory.limit_in_bytes``; None where none is set.
    ``own``: the (v2, v1 memory) cgroup paths, ``own_cgroups()`` by default."""
    unified, memory = own if own is not None else own_cgroups()
    limits = []
    for base, path, name in (
        (root, unified, "memory.max"),
        (root / "memory", memory, "memory.limit_in_bytes"),
    ):
        folder = base / path.strip("/")
        while True:
            found = limit_in(folder / name)
            if found is not None:
                limits.append(found)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(limits, default=None)


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def bounds_of(limit: int | None, physical: int) -> tuple[tuple[str, int], ...]:
    physical_bound = ((PHYSICAL, physical),)
    return physical_bound if limit is None else ((CGROUP_LIMIT, limit), *physical_bound)


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


def paid_cpus(affinity: int, root: Path = CGROUP) -> tuple[float, str]:
    """The logical CPUs this process is paid for, and how that was read."""
    quota = cgroup_cores(root)
    if quota is not None:
        return min(float(affinity), quota), f"{min(float(affinity), quota):g} CPUs (cgroup quota)"
    request = cgroup_cpu_request(root)
    if request is not None:
        cpus = min(float(affinity), max(1.0, request))
        return cpus, f"{cpus:g} CPUs (no quota: the cgroup's CPU request of {request:.2f})"
    return float(affinity), f"{affinity} CPUs (this process's affinity, no quota or request)"


def read_machine(
    gpus: int,
    cgroup: Path = CGROUP,
    topology: Path = CPU_TOPOLOGY,
    own: tuple[str, str] | None = None,
    physical: int | None = None,
) -> Machine:
    """The CPUs paid for and the physical cores under them (never more than those CPUs); the
    least of the cgroup's memory limit and the physical memory (``physical``, read here unless
    given); with ``gpus`` of its GPUs (their memory read here)."""
    affinity = os.sched_getaffinity(0)
    cpus, cpu_source = paid_cpus(len(affinity), cgroup)
    cores = min(float(physical_cores(affinity, topology)), cpus)
    bounds = bounds_of(
        cgroup_memory(cgroup, own), physical_memory() if physical is None else physical
    )
    gpu_memory = 0
    if gpus:
        import torch

        gpu_memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus))
    return Machine(
        cores=cores,
        memory_bytes=least_memory(bounds)[1],
        gpus=gpus,
        gpu_memory_bytes=gpu_memory,
        cpus=cpus,
        cpu_source=f"{cpu_source}, {cores:g} physical core(s) under them",
        memory_bounds=bounds,
    )


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def serving_gpus(properties: dict[str, str]) -> int:
    """The GPUs TorchServe hands to workers: this machine's, capped by ``number_of_gpu``."""
    return min(gpu_count(), int(properties.get("number_of_gpu", sys.maxsize)))


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
MANIFEST = "MAR-INF/MANIFEST.json"
PROGRESS = "measure-progress: "
"""The child's line on stderr for each step done (``progress``)."""
WORST_FIRST = "\U0001f600"
"""A character past U+FFFF: in a text, it makes Python hold every character of it in 4 bytes."""
WORST_REST = "!"
"""One byte in the body, and a token of its own: the most tokens a character can make."""
LIST_FIELD_BYTES = len('{"texts": []}')
HOLDING = "held the largest batch"
"""The child's step once the largest batch is held: a failure past it is the batch's."""
NOT_MEASURED = "not measured"
"""How ``WorkerMemory.batch`` begins where the largest batch could not be measured."""


def progress(step: str) -> None:
    """Tell the parent (``in_fresh_process``) that the child finished ``step``."""
    print(f"{PROGRESS}{step}", file=sys.stderr, flush=True)


def largest_bodies(
    batch_size: int, max_request_bytes: int | None, max_chars: int, max_texts: int
) -> tuple[list[bytearray], str]:
    """The largest batch the limits admit, as a worker holds it (TorchServe hands each body as a
    ``bytearray``), and its description: ``batch_size`` requests, each the largest body the
    frontend admits (``max_request_bytes``; None: the handler's largest) within what the handler
    accepts, a list of up to ``max_texts`` pairs of texts of ``max_chars`` characters, as many as
    the body holds. Each text is one character past U+FFFF (Python then holds all of its
    characters in 4 bytes) and ``!`` (a byte in the body, a token of its own)."""
    limit = min(max_request_bytes or sys.maxsize, handler_body_bytes(max_chars, max_texts))
    limit = max(1, limit - REQUEST_OVERHEAD_BYTES // 2)  # the frontend's limit counts the body
    text = WORST_FIRST + WORST_REST * (max_chars - 1)
    item = {"text": text, "text_pair": text}
    item_bytes = len(json.dumps(item, ensure_ascii=False).encode()) + len(", ")
    items = min(max_texts, (limit - LIST_FIELD_BYTES) // item_bytes)
    if items >= 1:
        document: dict[str, Any] = {"texts": [item] * items}
        shown = f"{items} text pairs of {max_chars:,} characters"
    else:  # a body smaller than one pair: one text of what it holds
        chars = max(1, min(max_chars, limit - len('{"text": ""}') - len(WORST_FIRST.encode()) + 1))
        document = {"text": (WORST_FIRST + WORST_REST * max_chars)[:chars]}
        shown = f"one text of {chars:,} characters"
    body = json.dumps(document, ensure_ascii=False).encode()
    return [bytearray(body) for _ in range(batch_size)], (
        f"{batch_size} requests of {shown}, {len(body):,} bytes each"
    )


def decoded_texts(bodies: list[bytearray]) -> tuple[list[Any], list[Any]]:
    """The bodies decoded as the handler decodes them (strict UTF-8, then JSON), one at a time,
    and the texts (a pair as a tuple) the batch classifies; both are held while it runs."""
    documents, texts = [], []
    for body in bodies:
        document = json.loads(bytes(body).decode("utf-8"))
        documents.append(document)
        items = document.get("texts", [document])
        texts += [
            (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
            for item in items
        ]
    return documents, texts


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
    batch_bytes: int = 0
    """What holding and tokenizing the largest batch added to the peak."""
    batch_s: float = 0.0
    """Seconds the largest batch took to decode and tokenize."""
    batch: str = ""
    """The largest batch, in words."""


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


def load_archive(
    mar: Path, threads: int, gpus: int, as_a_worker: bool = False, precision: str | None = None
) -> tuple[Any, Any]:
    """(loaded model, handler settings) of the .mar's own model, handler code and settings,
    in this process with ``threads`` torch threads (on GPU 0 where there is one), in
    ``precision`` where the archive's is ``auto`` (the start's choice; None: fp32); with
    ``as_a_worker``, also what a TorchServe worker imports besides (its service loop and the
    archive's whole handler), for its memory."""
    with opened_archive(mar, as_a_worker) as load:
        loaded, settings = load(threads, gpus, precision)
    return loaded, settings


@contextmanager
def opened_archive(mar: Path, as_a_worker: bool = False) -> Iterator[Callable[..., Any]]:
    """``load(threads, gpus, precision)`` of ``load_archive``, as often as asked, while the
    archive is unpacked and its own ``handler`` package imported. This process must not have
    imported ``handler`` yet: ``in_fresh_process`` runs it in a fresh one."""
    import torch

    with tempfile.TemporaryDirectory(prefix="bert-serve-sizing-") as unpacked:
        with zipfile.ZipFile(mar) as archive:
            archive.extractall(unpacked)
        sys.path.insert(0, unpacked)
        try:
            import handler
            import handler.inference  # loaded while the archive's folder exists
            from handler.model import load_model
            from handler.precision import AUTO
            from handler.settings import HandlerSettings

            if not Path(handler.__file__ or "").is_relative_to(unpacked):
                raise RuntimeError(
                    f"handler was imported from {handler.__file__}, not from {mar.name}: "
                    "measure each archive in a fresh process (in_fresh_process)"
                )
            if as_a_worker:
                import_worker_modules()
            configured = HandlerSettings.from_mapping(archive_handler_config(mar))

            def load(threads: int, gpus: int, precision: str | None) -> tuple[Any, Any]:
                settings = configured
                if precision is not None and settings.precision == AUTO:
                    settings = replace(settings, precision=precision)
                torch.set_num_threads(threads)
                loaded = load_model(Path(unpacked, "model"), settings, 0 if gpus else None)
                return loaded, settings

            yield load
        finally:
            sys.path.remove(unpacked)


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
    mar: Path,
    batch_sizes: tuple[int, ...],
    threads: int,
    gpus: int,
    precision: str | None = None,
    rounds: int = ROUNDS,
) -> dict[int, list[float]]:
    """One worker of ``mar``: its texts/s at each batch size, ``rounds`` times, each round
    going through every size once on the same ``SAMPLE_COUNT`` texts."""
    loaded, settings = load_archive(mar, threads, gpus, precision=precision)
    progress("loaded the model")
    from handler.inference import classify  # the archive's own, imported by load_archive

    texts = sample_texts(max(SAMPLE_COUNT, max(batch_sizes)))

    def one_pass(batch_size: int) -> None:
        for start in range(0, len(texts), batch_size):
            window = texts[start : start + batch_size]
            classify(loaded, window, settings.max_length, loaded.max_batch_tokens)

    for batch_size in batch_sizes:  # warm-up: every shape's first pass is slower
        classify(loaded, texts[:batch_size], settings.max_length, loaded.max_batch_tokens)
    progress("warmed up")
    samples: dict[int, list[float]] = {size: [] for size in batch_sizes}
    for number in range(rounds):
        for batch_size in batch_sizes:
            done, started = 0, time.perf_counter()
            while done == 0 or time.perf_counter() - started < MIN_ROUND_S:
                one_pass(batch_size)
                done += len(texts)
            samples[batch_size].append(round(done / (time.perf_counter() - started), 2))
            progress(f"round {number + 1} of {rounds} at {batch_size}")
    return samples


REFERENCE_TEXTS = "reference-texts.txt"
"""The texts ``package --reference`` packs at the archive's root (one a line, a pair by a tab):
what ``auto`` checks a reduced precision's answers on, else ``sample_texts(CHECK_TEXTS)``."""
CHECK_TEXTS = 128
SPEED_SIZES = (1, 16)
"""The batch sizes a reduced precision must be faster at on a CPU: a lone request and a batch."""
SPEED_ROUND_S = 0.5


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``auto`` settled on for one archive (``handler.precision.choose_precision``)."""

    precision: str
    why: str


def check_texts(mar: Path) -> list[Any]:
    """The archive's reference texts where it packs them, else ``CHECK_TEXTS`` sample texts."""
    with zipfile.ZipFile(mar) as archive:
        if REFERENCE_TEXTS in archive.namelist():
            lines = archive.read(REFERENCE_TEXTS).decode("utf-8").splitlines()
            texts = [tuple(line.split("\t", 1)) if "\t" in line else line for line in lines]
            return [text for text in texts if text]
    return sample_texts(CHECK_TEXTS)


def measure_precision(mar: Path, gpus: int) -> PrecisionChoice:
    """``auto`` settled for ``mar`` on this machine's device (``choose_precision``): fp32 and
    the reduced precision loaded in turn, as a worker loads them, their answers compared on
    ``check_texts``; on a CPU, their texts/s at ``SPEED_SIZES`` (the reduced one's least ratio,
    each size's best of two alternating rounds). One torch thread: a ratio per core."""
    import torch

    texts = check_texts(mar)
    with opened_archive(mar) as load_in:
        from handler.inference import classify
        from handler.precision import choose_precision, hardware_of

        max_length = 0

        def load(precision: str) -> Any:
            nonlocal max_length
            loaded, settings = load_in(1, gpus, precision)
            max_length = settings.max_length
            progress(f"loaded the model in {precision}")
            return loaded

        def run(loaded: Any, batch: list[Any]) -> list[Any]:
            return classify(loaded, batch, max_length, loaded.max_batch_tokens)[0]

        def answers(loaded: Any) -> list[Any]:
            return [
                p
                for start in range(0, len(texts), 16)
                for p in run(loaded, texts[start : start + 16])
            ]

        def rate(loaded: Any, batch: list[Any]) -> float:
            done, started = 0, time.perf_counter()
            while done == 0 or time.perf_counter() - started < SPEED_ROUND_S:
                run(loaded, batch)
                done += len(batch)
            return done / (time.perf_counter() - started)

        def speedup(fast: Any, exact: Any) -> float:
            ratios = []
            for size in SPEED_SIZES:
                batch = sample_texts(size)
                rounds = [(rate(exact, batch), rate(fast, batch)) for _ in range(2)]
                ratios.append(max(f for _, f in rounds) / max(e for e, _ in rounds))
                progress(f"timed batches of {size}")
            return min(ratios)

        device = torch.device("cuda", 0) if gpus else torch.device("cpu")
        choice = choose_precision(hardware_of(device), load, answers, speedup)
    return PrecisionChoice(choice.precision, choice.why)


SAMPLE_S = 0.5
"""How long the first items of the largest batch are tokenized for, to foresee the whole."""
SAMPLE_REQUESTS = 2
"""Requests' worth of the largest batch's texts tokenized while the whole batch is held (its
bodies, documents and texts, most of what it adds): the tokenizer's own memory is bounded by
its chunk, so the rest of the batch would add only the tokens kept, counted (``kept_bytes``)
for the sample and scaled. The whole batch, 64 requests of 52 pairs of 10,000 characters,
took 45 s to tokenize on 2 cores."""


def tokenize_seconds(
    tokenize: Callable[..., Any], tokenizer: Any, texts: list[Any], max_length: int
) -> float:
    """The seconds ``tokenize`` would take over ``texts``, foreseen from its first ones: 1,
    then twice as many each time until they take ``SAMPLE_S`` (a call's own cost spread over
    many, as over the whole batch), or all of them."""
    count = 1
    while True:
        started = time.perf_counter()
        tokenize(tokenizer, texts[:count], max_length)
        took = time.perf_counter() - started
        if took >= SAMPLE_S or count >= len(texts):
            return took * len(texts) / count
        count = min(len(texts), count * 2)


def measure_memory(
    mar: Path,
    threads: int,
    batch_size: int = max(BATCH_SIZES),
    max_request_bytes: int | None = None,
    precision: str | None = None,
) -> WorkerMemory:
    """One worker's memory: ``mar``'s model loaded in this process with ``threads`` torch
    threads as a worker loads it (``load_archive(as_a_worker=True)``), a batch of
    ``batch_size`` texts as long as the handler reads (``max_length`` tokens) classified, the
    sample texts at every batch size; then the largest batch the limits admit held, decoded and
    tokenized (``largest_bodies``, ``handler.inference.tokenize``), and the longest batch
    classified again while it is held, as a worker forwards it; with ``long_texts: windows``,
    the windows each request may bring (``max_windows_per_request``) counted besides."""
    loaded, settings = load_archive(mar, threads, 0, as_a_worker=True, precision=precision)
    progress("loaded the model")
    from handler.inference import classify, tokenize

    longest = " ".join(SAMPLE_WORDS * (1 + settings.max_length // len(SAMPLE_WORDS)))
    classify(loaded, [longest] * batch_size, settings.max_length, loaded.max_batch_tokens)
    progress("classified the longest batch")
    texts = sample_texts(SAMPLE_COUNT)
    for size in BATCH_SIZES:  # batches of every shape, as traffic brings them
        for start in range(0, len(texts), size):
            window = texts[start : start + size]
            classify(loaded, window, settings.max_length, loaded.max_batch_tokens)
        progress(f"classified the sample texts in batches of {size}")
    if batch_size < 1:  # the largest batch left out (``memory_of``'s second try)
        return WorkerMemory(*process_memory())
    before = process_memory()
    bodies, shown = largest_bodies(
        batch_size, max_request_bytes, settings.max_chars, settings.max_texts_per_request
    )
    held = decoded_texts(bodies)
    progress(f"{HOLDING} ({shown})")
    expected_s = tokenize_seconds(tokenize, loaded.tokenizer, held[1], settings.max_length)
    if expected_s > timeout_s(mar):
        del bodies, held
        return WorkerMemory(  # as it was before the batch: its first items alone can balloon
            *before,
            batch=(
                f"{NOT_MEASURED}: {shown} would take about {expected_s:,.0f} s to tokenize "
                "(handler.inference.tokenize, timed on its first items), past the measurement's "
                "timeout: a worker given it would miss its responseTimeout. Lower "
                "max_request_size, max_chars, max_texts_per_request or batchSize, or make the "
                "handler's tokenizing of such items cheaper"
            ),
        )
    progress(f"timed its first items: all {len(held[1]):,} in about {expected_s:.0f} s")
    sample = held[1][: max(1, len(held[1]) * SAMPLE_REQUESTS // batch_size)]
    tokenized = tokenize(loaded.tokenizer, sample, settings.max_length)
    progress(f"tokenized {len(sample):,} of the largest batch's texts")
    classify(loaded, [longest] * batch_size, settings.max_length, loaded.max_batch_tokens)
    peak, uss, pss = process_memory()
    rest = round(kept_bytes(tokenized) * (len(held[1]) - len(sample)) / len(sample))
    del bodies, held, tokenized
    if getattr(settings, "long_texts", "truncate") == "windows":
        # each request's windows kept besides: as many as it may bring, of a full window each
        from handler.inference import tokenize_windows

        (rows,) = tokenize_windows(
            loaded.tokenizer, [longest * 8], settings.max_length, settings.stride
        )
        rest += round(batch_size * settings.windows_per_request * kept_bytes(rows) / len(rows))
        shown += f", and {settings.windows_per_request:,} windows a request"
    foreseen = peak + rest
    return WorkerMemory(
        foreseen, uss, pss, max(0, foreseen - before[0]), round(expected_s, 2), shown
    )


def kept_bytes(tokenized: list[Any]) -> int:
    """What the tokens ``handler.inference.tokenize`` keeps take in Python: each item, its
    lists, and an int object per token id (type ids and masks are 0 or 1, which Python
    shares)."""
    total = 0
    for item in tokenized:
        lists = (item.input_ids, item.token_type_ids or [], item.special_tokens_mask or [])
        total += sys.getsizeof(item) + sum(map(sys.getsizeof, lists))
        total += sum(sys.getsizeof(token) for token in item.input_ids if token > 256)
    return total


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
    progress("the GPU's batch ready")
    device_s, cpu_s = device_and_cpu_seconds(
        lambda: (
            classify(loaded, texts, settings.max_length, loaded.max_batch_tokens)[
                1
            ].sub_batch_forward_ms
        )
    )
    progress("timed the GPU's batch")
    kernel_s = kernel_seconds(
        lambda: classify(loaded, texts, settings.max_length, loaded.max_batch_tokens)
    )
    progress("profiled the GPU's batch")
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
from bert_serve_server import probe
what, mar, args = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
if what == "rates":
    print(json.dumps(probe.measure_rates(mar, tuple(args[0]), *args[1:])))
elif what == "memory":
    print(json.dumps(asdict(probe.measure_memory(mar, *args))))
elif what == "precision":
    print(json.dumps(asdict(probe.measure_precision(mar, *args))))
else:
    loaded, settings = probe.load_archive(mar, 1, 1, precision=args[1])
    probe.progress("loaded the model on the GPU")
    print(json.dumps(asdict(probe.measure_device_load(loaded, settings, args[0]))))
"""


TIMEOUT_ENV = "BERT_SERVE_MEASURE_TIMEOUT_S"
"""Seconds a measuring child may go without finishing a step, in place of ``timeout_s``'s."""
STEP_TIMEOUT_S = 120.0
"""The least time a step may take: importing torch, initializing CUDA, a forward pass take
seconds on a healthy machine, a busy one several times that; two minutes without one done is a
hang (a CUDA initialization that never returns), not a slow machine."""
STEP_S_PER_GIB = 120.0
"""And per GiB of archive: its steps (unpacking, loading, each batch) grow with its weights."""
POLL_S = 0.2


def timeout_s(mar: Path, environ: dict[str, str] | None = None) -> float:
    """How long a measuring child of ``mar`` may go without finishing a step: ``TIMEOUT_ENV``
    where set, else ``STEP_TIMEOUT_S`` and ``STEP_S_PER_GIB`` of its archive."""
    stated = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
    if stated:
        try:
            seconds = float(stated)
        except ValueError:
            raise MeasureError("", f"{TIMEOUT_ENV}={stated!r}: seconds are needed") from None
        if seconds <= 0:
            raise MeasureError("", f"{TIMEOUT_ENV}={stated!r}: more than 0 is needed")
        return seconds
    return STEP_TIMEOUT_S + STEP_S_PER_GIB * mar.stat().st_size / 2**30


AVAILABLE_SHARE = 0.9
"""Of the memory available when a child starts, what it may take: the rest for the processes
beside it (a measurement must not push the machine into its OOM killer)."""


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable``, None where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def child_cap(cap_bytes: int | None) -> int | None:
    """The most a child may hold: ``cap_bytes``, and never more than ``AVAILABLE_SHARE`` of the
    memory available now."""
    available = available_bytes()
    room = None if available is None else int(available * AVAILABLE_SHARE)
    caps = [cap for cap in (cap_bytes, room) if cap is not None]
    return min(caps) if caps else None


def resident_bytes(pid: int) -> int:
    """A process's resident set (``VmRSS``), 0 where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MeasureFailed(RuntimeError):
    """A measuring child failed, was stopped or timed out; ``step``: the last one it finished."""

    def __init__(self, message: str, step: str) -> None:
        super().__init__(message)
        self.step = step


class Child:
    """A measuring child: its output read as it comes, its last step, its resident set."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=tempfile.gettempdir(),
        )  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        self.step, self.step_at = "started", time.monotonic()
        self.readers = [
            threading.Thread(target=self.read, args=(self.process.stdout, self.out), daemon=True),
            threading.Thread(target=self.read, args=(self.process.stderr, None), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def read(self, stream: Any, into: list[str] | None) -> None:
        for line in stream:
            if into is not None:
                into.append(line)
            elif line.startswith(PROGRESS):
                self.step, self.step_at = line[len(PROGRESS) :].strip(), time.monotonic()
            else:
                self.err.append(line)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()

    def finish(self) -> tuple[int, str, str]:
        code = self.process.wait()
        for reader in self.readers:
            reader.join()
        return code, "".join(self.out), "".join(self.err)


def in_fresh_process(what: str, mar: Path, args: list[Any], cap_bytes: int | None = None) -> Any:
    """``measure_rates`` (``what`` "rates"), ``measure_memory`` ("memory") or
    ``measure_device_load`` ("device_load") of ``mar`` in a fresh Python process, its JSON answer
    decoded: the archive's own ``handler`` package is the one imported, no process-wide setting
    (torch threads, attention kernels, matmul precision) carries over, and the memory measured
    is that worker's alone. The child is stopped, and the measurement fails saying why, when it
    goes ``timeout_s`` without finishing a step, or holds more than ``cap_bytes``."""
    limit_s = timeout_s(mar)
    cap_bytes = child_cap(cap_bytes)
    child = Child(
        [sys.executable, "-c", MEASURE_SCRIPT, what, str(mar.resolve()), json.dumps(args)]
    )
    peak = 0
    while child.process.poll() is None:
        time.sleep(POLL_S)
        peak = max(peak, resident_bytes(child.process.pid))
        if cap_bytes is not None and peak > cap_bytes:
            child.stop()
            raise MeasureFailed(
                f"measuring {mar.name} ({what}) stopped: the worker passed {peak // 2**20} MiB, "
                f"more than the {cap_bytes // 2**20} MiB this machine can give it, after "
                f"'{child.step}' (the largest batch the limits admit: lower max_request_size, "
                "max_chars, max_texts_per_request or batchSize, or give it more memory)",
                child.step,
            )
        silent = time.monotonic() - child.step_at
        if silent > limit_s:
            child.stop()
            raise MeasureFailed(
                f"measuring {mar.name} ({what}) timed out: no step done for {silent:.0f} s after "
                f"'{child.step}' (a hung CUDA initialization or device, or a machine far slower "
                f"than expected); {TIMEOUT_ENV} sets the seconds a step may take "
                f"({limit_s:.0f} here)",
                child.step,
            )
    code, stdout, stderr = child.finish()
    if code != 0:
        # The whole of it on stderr (the container's log): why the model could not load.
        print(f"measure: {mar.name} ({what}) failed:\n{stderr.rstrip()}", file=sys.stderr)
        killed = " (killed: SIGKILL, out of memory?)" if code in (-9, 137) else ""
        why = exception_line(stderr) or f"exit code {code}{killed}"
        raise MeasureFailed(f"measuring {mar.name} failed after '{child.step}': {why}", child.step)
    return json.loads(stdout)


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


def remembered(
    what: str, mar: str, mtime_ns: int, args: list[Any], cap_bytes: int | None = None
) -> Any:
    """``in_fresh_process``'s answer, from ``CACHE_ENV``'s folder where it was measured."""
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        return in_fresh_process(what, Path(mar), args, cap_bytes)
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
        answer = in_fresh_process(what, Path(mar), args, cap_bytes)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(answer))
        scratch.replace(path)  # atomic: a process reading it sees all of it or nothing
    return answer


@functools.cache
def measured_samples(
    mar: str,
    mtime_ns: int,
    batch_sizes: tuple[int, ...],
    threads: int,
    gpus: int,
    precision: str | None = None,
) -> dict[int, list[float]]:
    """``measure_rates`` once per archive version and layout in a process (a test session
    starts many servers on one .mar)."""
    raw = remembered("rates", mar, mtime_ns, [list(batch_sizes), threads, gpus, precision])
    return {int(size): rates for size, rates in raw.items()}


def measured_rates(
    mar: str,
    mtime_ns: int,
    batch_sizes: tuple[int, ...],
    threads: int,
    gpus: int,
    precision: str | None = None,
) -> dict[int, float]:
    """Each batch size's best texts/s of its rounds (``measured_samples``)."""
    return best_rates(measured_samples(mar, mtime_ns, batch_sizes, threads, gpus, precision))


@dataclass(frozen=True)
class Probe:
    """What a worker's memory is measured with: the plan's torch threads per worker, and the
    largest batch the limits admit (``largest_bodies``)."""

    threads: int
    batch_sizes: tuple[tuple[str, int], ...] = ()
    """(archive path, its largest batch in requests: the stated ``batchSize``); an archive not
    here: ``max(BATCH_SIZES)``, the largest the start chooses."""
    max_request_bytes: int | None = None
    """The frontend's ``max_request_size``; None: the handler's largest body, as the start sets
    it where the config states none."""
    cap_bytes: int | None = None
    """The most a worker may hold on this machine: a child past it is stopped."""

    def batch_size(self, mar: str) -> int:
        return dict(self.batch_sizes).get(mar, max(BATCH_SIZES))


PROBE: ContextVar[Probe | None] = ContextVar("bert_serve_memory_probe", default=None)
"""The probe the start measures workers with (``probing``); unset: ``default_probe``."""


@contextmanager
def probing(probe: Probe) -> Iterator[Probe]:
    """``measured_memory`` measures with ``probe`` within this block."""
    token = PROBE.set(probe)
    try:
        yield probe
    finally:
        PROBE.reset(token)


def default_probe() -> Probe:
    """Outside a start: as many torch threads as this process may use (a worker never gets more)
    and the shipped config's ``max_request_size``."""
    stated = read_properties(BASE_CONFIG).get("max_request_size")
    return Probe(len(os.sched_getaffinity(0)), (), int(stated) if stated else None)


def measured_memory(
    mar: str, mtime_ns: int, probe: Probe | None = None, precision: str | None = None
) -> WorkerMemory:
    """``measure_memory`` once per archive version and probe, in a fresh process, with the
    probe given, else the start's (``probing``), else ``default_probe``."""
    probe = probe or PROBE.get() or default_probe()
    return memory_of(mar, mtime_ns, probe.threads, probe.batch_size(mar),
                     probe.max_request_bytes, probe.cap_bytes, precision)  # fmt: skip


@functools.cache
def memory_of(
    mar: str,
    mtime_ns: int,
    threads: int,
    batch_size: int,
    max_request_bytes: int | None,
    cap_bytes: int | None,
    precision: str | None = None,
) -> WorkerMemory:
    """``measure_memory`` in a fresh process (``remembered``). Where the child fails once it
    holds the largest batch (stopped past ``cap_bytes``, timed out, killed), the worker is
    measured again without it, and ``WorkerMemory.batch`` says why it was left out: the model
    itself is served, and the start says that such a batch is not within its budget."""
    args = [threads, batch_size, max_request_bytes, precision]
    try:
        return WorkerMemory(**remembered("memory", mar, mtime_ns, args, cap_bytes))
    except MeasureFailed as error:
        if not error.step.startswith(HOLDING):
            raise
        args = [threads, 0, None, precision]
        without = WorkerMemory(**remembered("memory", mar, mtime_ns, args, cap_bytes))
        return replace(without, batch=f"{NOT_MEASURED}: {error}")


@functools.cache
def measured_device_load(
    mar: str, mtime_ns: int, batch_size: int, precision: str | None = None
) -> DeviceLoad:
    """``measure_device_load`` of the archive's own model, once per archive version, in a
    fresh process (``in_fresh_process``)."""
    return DeviceLoad(**remembered("device_load", mar, mtime_ns, [batch_size, precision]))


@functools.cache
def measured_precision(mar: str, mtime_ns: int, gpus: int) -> PrecisionChoice:
    """``measure_precision`` once per archive version, in a fresh process."""
    return PrecisionChoice(**remembered("precision", mar, mtime_ns, [gpus]))
