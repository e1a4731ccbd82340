"""server/bert_serve_server/sizing.py: the machine read from cgroup files, and the rule from machine and
measured rate to workers, threads, queue and heap; the config's own values always win."""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from bert_serve_server import probe, rules, sizing
from bert_serve_server.config import configured_model, effective_properties
from bert_serve_server.rules import Machine

from tests.conftest import ROOT

GIB = 2**30
MIB = 2**20


def test_cgroup_v2_and_v1_quotas(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    (tmp_path / "memory.max").write_text(f"{3 * GIB}\n")
    assert probe.cgroup_cores(tmp_path) == 2.5
    assert probe.cgroup_memory(tmp_path) == 3 * GIB
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert probe.cgroup_cores(tmp_path) is None
    assert probe.cgroup_memory(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert probe.cgroup_cores(v1) == 4.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert probe.cgroup_cores(v1) is None
    assert probe.cgroup_memory(v1) is None


@pytest.mark.parametrize(
    ("machine", "workers", "threads"),
    [
        (Machine(cores=32, memory_bytes=128 * GIB, gpus=0), 32, 1),
        (Machine(cores=2.5, memory_bytes=8 * GIB, gpus=0), 2, 1),
        (Machine(cores=0.5, memory_bytes=8 * GIB, gpus=0), 1, 1),
        # 32 workers of 1 GiB cannot fit in half of 8 GiB: 4 do
        (Machine(cores=32, memory_bytes=8 * GIB, gpus=0), 4, 8),
    ],
)
def test_workers_and_threads_follow_cores_and_memory(
    machine: Machine, workers: int, threads: int
) -> None:
    got, reasons = rules.workers_for(machine, worker_bytes=GIB)
    assert (got, rules.threads_for(machine, got)) == (workers, threads)
    assert reasons


REQUEST = rules.queued_request_bytes(2**20)
"""A queued request as the shipped limits hold it: a body of max_request_size (1 MiB), which a
list of texts can fill, and the request's own objects."""
WORKER = probe.WorkerMemory(peak_bytes=640 * MIB, uss_bytes=600 * MIB, pss_bytes=620 * MIB)


def fp32_chosen(*args: object) -> probe.PrecisionChoice:
    """The precision ``auto`` settles on, as a start would measure it (not measured here)."""
    return probe.PrecisionChoice("fp32", "fp32: not measured in this test")


"""A worker as a start would measure the shipped model's (deploy/image-test.json: 635 MiB PSS)."""


def test_a_queued_request_is_budgeted_as_the_largest_body_lists_included() -> None:
    """A list of 64 texts of 10,000 characters, JSON-escaped at worst, is far more than one
    text: the frontend's max_request_size bounds it, and a request is budgeted that body."""
    from handler.settings import HandlerSettings

    handler = HandlerSettings()
    assert rules.DEFAULT_MAX_CHARS == handler.max_chars
    assert rules.DEFAULT_MAX_TEXTS == handler.max_texts_per_request
    largest = rules.handler_body_bytes()
    assert (
        largest == 64 * (2 * 10_000 * 12 + rules.ITEM_FRAMING_BYTES) + rules.REQUEST_OVERHEAD_BYTES
    )
    assert REQUEST == 2**20 + rules.REQUEST_OVERHEAD_BYTES
    assert rules.queued_request_bytes(2**30) == largest + rules.REQUEST_OVERHEAD_BYTES
    assert rules.queued_request_bytes(2**30, max_chars=100, max_texts=1) == (
        2 * 100 * 12 + rules.ITEM_FRAMING_BYTES + 2 * rules.REQUEST_OVERHEAD_BYTES
    )


def inputs(workers: int, texts_per_s: float, request_bytes: int, **more: int) -> rules.QueueInputs:
    return rules.QueueInputs(workers, texts_per_s, request_bytes, **more)  # type: ignore[arg-type]


def test_queue_is_a_patient_minute_of_drain_and_the_heap_holds_it() -> None:
    machine = Machine(cores=4, memory_bytes=64 * GIB, gpus=0)
    queue, heap_mb, _ = rules.derive(machine, inputs(4, 10.0, REQUEST))
    assert queue == 4 * 10 * 60
    assert heap_mb == rules.BASE_HEAP_MIB + math.ceil(queue * REQUEST / MIB)


def test_a_small_memory_cuts_the_queue_to_what_the_heap_holds() -> None:
    """The heap gets what the workers, the JVM's non-heap memory and the slack leave, no more."""
    machine = Machine(cores=4, memory_bytes=2 * GIB, gpus=0)
    queue, heap_mb, reasons = rules.derive(machine, inputs(4, 100.0, MIB, reserved_bytes=GIB))
    assert heap_mb == (
        2048 - 1024 - rules.FRONTEND_NON_HEAP_BYTES // MIB - rules.SERVER_SLACK_BYTES // MIB
    )
    assert queue == heap_mb - rules.BASE_HEAP_MIB
    assert any("cut" in reason for reason in reasons)


def test_the_heap_stays_under_the_compressed_pointer_limit() -> None:
    machine = Machine(cores=64, memory_bytes=1024 * GIB, gpus=0)
    queue, heap_mb, reasons = rules.derive(machine, inputs(64, 5000.0, REQUEST))
    assert heap_mb == rules.COMPRESSED_OOPS_MIB < 32 * 1024
    assert queue == int((heap_mb - rules.BASE_HEAP_MIB) / (REQUEST / MIB))
    assert any("compressed-pointer" in reason for reason in reasons)


def test_heap_flag_parsing() -> None:
    assert rules.heap_mib_in("-Dx=y -Xmx2g") == 2048
    assert rules.heap_mib_in("-Xmx512m -Xms256m") == 512
    assert rules.heap_mib_in("-Xms256m") is None
    assert rules.heap_mib_in("-XX:MaxHeapSize=1073741824") == 1024
    assert rules.heap_mib_in("-Xmx1g -XX:MaxHeapSize=2g") == 2048, "the JVM takes the last"
    assert rules.heap_mib_in("-XX:MaxRAMPercentage=50.0", memory_bytes=4 * GIB) == 2048
    assert rules.heap_mib_in("-XX:MaxRAMPercentage=50") is None, "a share of unknown memory"
    assert rules.heap_stated("-XX:MaxRAMPercentage=50") and not rules.heap_stated("-Xms1g")


RATES = {1: 20.0, 2: 30.0, 4: 40.0, 8: 46.0, 16: 50.0, 32: 49.0, 64: 51.0}
"""A worker's texts/s by batch size: 46 at 8 is within 10 % of the best (51 at 64)."""


@pytest.fixture
def machine_of_8_cores(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, ...], int]]:
    """An 8-core, 128 GiB machine whose workers classify at ``RATES``; records each
    measurement (batch sizes, threads)."""
    measured: list[tuple[tuple[int, ...], int]] = []

    def rates(
        mar: str,
        mtime_ns: int,
        batch_sizes: tuple[int, ...],
        threads: int,
        gpus: int,
        precision: str | None = None,
    ) -> dict[int, float]:
        measured.append((batch_sizes, threads))
        return {size: RATES[size] for size in batch_sizes}

    monkeypatch.setattr(sizing, "read_machine", lambda gpus: Machine(8, 128 * GIB, gpus))
    monkeypatch.setattr(sizing, "measured_rates", rates)
    monkeypatch.setattr(sizing, "measured_precision", fp32_chosen)
    monkeypatch.setattr(sizing, "measured_memory", lambda mar, mtime_ns, **_: WORKER)
    return measured


SERVED_LOAD = rules.DeviceLoad(
    batch_size=8, device_s=0.010, cpu_s=0.015, gpu_bytes=GIB, context_bytes=512 * MIB
)
"""A batch on the GPU as a start would measure it: 10 ms there, 15 ms of CPU around it."""


@pytest.fixture
def gpu_loads(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]], monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """The 8-core machine with 2 GPUs of 80 GiB, whose batches cost ``SERVED_LOAD``; records
    the batch size of each device measurement."""
    measured: list[int] = []

    def load(mar: str, mtime_ns: int, batch_size: int, *_: object) -> rules.DeviceLoad:
        measured.append(batch_size)
        return SERVED_LOAD

    monkeypatch.setattr(probe, "gpu_count", lambda: 2)
    monkeypatch.setattr(
        sizing,
        "read_machine",
        lambda gpus: Machine(8, 128 * GIB, gpus, 80 * GIB * (gpus > 0)),
    )
    monkeypatch.setattr(sizing, "measured_device_load", load)
    return measured


def test_batch_size_is_the_smallest_near_the_best_rate() -> None:
    assert rules.batch_size_for(RATES)[0] == 8
    assert rules.batch_size_for({2: 9.5, 4: 9.0, 8: 8.0})[0] == 2, "batching does not pay"
    assert 1 not in rules.BATCH_SIZES, "serving's cost per batch is not measured in-process"
    assert rules.batch_size_for({1: 10.0, 8: 60.0, 64: 200.0})[0] == 64, "a GPU-like curve"


def test_each_sizes_rate_is_its_best_round() -> None:
    """A round runs slower only while something else takes the core: a size measured in a
    slow spell keeps the rate of its undisturbed round, and the choice follows that."""
    samples = {16: [80.0, 81.0, 79.0], 32: [70.0, 68.0, 95.0], 64: [100.0, 99.0, 101.0]}
    assert rules.best_rates(samples) == {16: 81.0, 32: 95.0, 64: 101.0}
    chosen, why = rules.batch_size_for(rules.best_rates(samples))
    assert chosen == 32
    assert "the best of its rounds" in why and "95.0 at 32" in why


def test_resolve_fills_what_the_shipped_config_leaves_out(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]],
) -> None:
    assert "batchSize" not in configured_model(), "the plain start's batchSize: sized here"
    resolved = sizing.resolve(effective_properties(), gpus=0)
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    assert (entry["minWorkers"], entry["maxWorkers"], resolved.torch_threads) == (8, 8, 1)
    assert entry["batchSize"] == 8
    assert resolved.properties["job_queue_size"] == str(8 * 46 * 60)
    assert rules.heap_mib_in(resolved.properties["vmargs"]) == rules.heap_holding(
        8 * 46 * 60 * REQUEST, rules.G1, REQUEST
    )
    assert "-Dlog4j.configurationFile=" in resolved.properties["vmargs"]
    assert machine_of_8_cores == [(rules.BATCH_SIZES, 1)]


def test_a_stated_batch_size_is_measured_alone(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]],
) -> None:
    models = json.loads(effective_properties()["models"])
    models["bert"]["1.0"]["batchSize"] = 32
    resolved = sizing.resolve(effective_properties({"models": json.dumps(models)}), gpus=0)
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    assert entry["batchSize"] == 32
    assert resolved.properties["job_queue_size"] == str(8 * 49 * 60)
    assert machine_of_8_cores == [((32,), 1)]


def test_number_of_gpu_caps_the_gpus(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]], gpu_loads: list[int]
) -> None:
    """``number_of_gpu=0`` serves on the CPU of a GPU machine: a worker per core."""
    on_gpus = sizing.resolve(effective_properties())
    on_cpu = sizing.resolve(effective_properties({"number_of_gpu": "0"}))
    workers = [
        json.loads(resolved.properties["models"])["bert"]["1.0"]["minWorkers"]
        for resolved in (on_gpus, on_cpu)
    ]
    assert workers == [2 * SERVED_LOAD.busy_workers, 8]
    assert gpu_loads == [8], "measured once, at the batch size chosen"
    assert on_cpu.device_loads == {} and on_cpu.torch_threads == 1


def test_values_the_config_states_win(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]],
) -> None:
    models = json.loads(effective_properties()["models"])
    models["bert"]["1.0"] |= {"minWorkers": 2, "maxWorkers": 2, "batchSize": 4}
    overrides = {"models": json.dumps(models), "job_queue_size": "10", "vmargs": "-Xmx300m"}
    resolved = sizing.resolve(effective_properties(overrides), gpus=0)
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    assert (entry["minWorkers"], entry["batchSize"], resolved.torch_threads) == (2, 4, 4)
    assert resolved.properties["job_queue_size"] == "10"
    assert resolved.properties["vmargs"] == "-Xmx300m"
    assert machine_of_8_cores == [], "nothing left to measure"


def test_an_archive_without_a_model_is_not_measured(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]], tmp_path: Path
) -> None:
    """A handler of another kind (the floor's constant handler): workers are sized, the queue
    and heap are left to TorchServe."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "bert.mar", "w") as archive:
        archive.writestr("handler.py", "")
    resolved = sizing.resolve(effective_properties({"model_store": str(tmp_path)}), gpus=0)
    assert "job_queue_size" not in resolved.properties
    assert rules.heap_mib_in(resolved.properties["vmargs"]) is None
    assert machine_of_8_cores == []


@pytest.mark.parametrize(
    ("machine", "models", "workers"),
    [
        (Machine(cores=2, memory_bytes=64 * GIB, gpus=0), 2, [1, 1]),
        (Machine(cores=9, memory_bytes=64 * GIB, gpus=0), 2, [5, 4]),
        (Machine(cores=16, memory_bytes=64 * GIB, gpus=0), 3, [6, 5, 5]),
        # 8 workers of 1 GiB cannot fit in half of 6 GiB: 3 do, taken from the largest first
        (Machine(cores=8, memory_bytes=6 * GIB, gpus=0), 2, [2, 1]),
    ],
)
def test_models_share_the_cores_and_never_oversubscribe(
    machine: Machine, models: int, workers: list[int]
) -> None:
    """Workers x threads stays within the cores: the cores are shared among the models."""
    got, reasons = rules.shared_workers(machine, [GIB] * models)
    assert got == workers and reasons
    if not machine.gpus:
        assert sum(got) * rules.threads_for(machine, sum(got)) <= machine.cores


def test_more_models_than_cores_still_serve_each_and_say_so() -> None:
    machine = Machine(cores=2, memory_bytes=64 * GIB, gpus=0)
    got, reasons = rules.shared_workers(machine, [GIB] * 3)
    assert got == [1, 1, 1]
    assert any("share cores" in reason for reason in reasons)


def two_models(store: Path, broken: bool = False) -> dict[str, str]:
    """A config serving ``a`` (two versions) and ``b`` from archives in ``store``."""
    import zipfile

    for name in ("a-v1.mar", "a-v2.mar", "b.mar"):
        with zipfile.ZipFile(store / name, "w") as archive:
            archive.writestr("model/config.json", "{}")
    models = {
        "a": {"1": {"marName": "a-v1.mar", "defaultVersion": True}, "2": {"marName": "a-v2.mar"}},
        "b": {"1.0": {"marName": "b.mar", "minWorkers": 2, "maxWorkers": 2}},
    }
    return effective_properties(
        {
            "models": json.dumps(models),
            "model_store": str(store),
            "load_models": "a-v1.mar,a-v2.mar,b.mar",
        }
    )


def test_each_model_is_measured_on_its_own_archive_and_the_cores_shared(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]], tmp_path: Path
) -> None:
    """8 cores, b states 2 workers: a's two versions share the other 6, one thread each; the
    queue is the largest model's drain and the heap holds one per model."""
    resolved = sizing.resolve(two_models(tmp_path), gpus=0)
    models = json.loads(resolved.properties["models"])
    workers = {f"{n}:{v}": e["minWorkers"] for n, vs in models.items() for v, e in vs.items()}
    assert workers == {"a:1": 3, "a:2": 3, "b:1.0": 2}
    assert resolved.torch_threads == 1
    assert {e["batchSize"] for vs in models.values() for e in vs.values()} == {8}
    assert len(machine_of_8_cores) == 3, "each archive measured"
    assert resolved.properties["job_queue_size"] == str(3 * 46 * 60)
    heap = rules.heap_mib_in(resolved.properties["vmargs"])
    request = rules.queued_request_bytes(int(resolved.properties["max_request_size"]))
    assert "-XX:+UseG1GC" in resolved.properties["vmargs"], "8 CPUs and 128 GiB: G1"
    assert heap == rules.heap_holding(3 * 3 * 46 * 60 * request, rules.G1, request)
    assert heap > rules.BASE_HEAP_MIB + math.ceil(3 * 3 * 46 * 60 * request / MIB)
    assert not resolved.refused


def test_a_model_that_cannot_be_measured_is_refused_and_the_others_served(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measure = sizing.measured_rates

    def failing(mar: str, *args: object) -> dict[int, float]:
        if mar.endswith("a-v1.mar"):
            raise ValueError("the model's config has no labels")
        return measure(mar, *args)

    monkeypatch.setattr(sizing, "measured_rates", failing)
    monkeypatch.setattr(sizing, "measured_precision", fp32_chosen)
    resolved = sizing.resolve(two_models(tmp_path), gpus=0)
    assert resolved.refused == {"a:1": "ValueError: the model's config has no labels"}
    models = json.loads(resolved.properties["models"])
    assert set(models["a"]) == {"2"} and models["a"]["2"]["defaultVersion"] is True
    assert resolved.properties["load_models"] == "a-v2.mar,b.mar"
    workers = {f"{n}:{v}": e["minWorkers"] for n, vs in models.items() for v, e in vs.items()}
    assert workers == {"a:2": 6, "b:1.0": 2}, "a:1's 3 cores go to a:2 (b states its 2)"
    assert not any(reason.startswith("a:1: batchSize") for reason in resolved.reasons)


def gpu_load(device_ms: float, cpu_ms: float, gpu_gib: float = 1.0) -> rules.DeviceLoad:
    return rules.DeviceLoad(16, device_ms / 1e3, cpu_ms / 1e3, int(gpu_gib * GIB), 512 * MIB)


def h100_host(cores: float = 16, gpus: int = 1, memory: int = 128 * GIB) -> Machine:
    return Machine(cores, memory, gpus, gpu_memory_bytes=80 * GIB)


@pytest.mark.parametrize(
    ("device_ms", "cpu_ms", "workers"),
    [(10, 0, 1), (10, 5, 2), (10, 10, 2), (10, 25, 4), (2, 20, 11), (10, 20, 3)],
)
def test_workers_per_gpu_cover_one_workers_cycle(
    device_ms: float, cpu_ms: float, workers: int
) -> None:
    """Where the profiler timed no kernels, ceil(1 + cpu / gpu): the fewest n with
    n x gpu >= cpu + gpu."""
    load = gpu_load(device_ms, cpu_ms)
    assert load.busy_workers == workers
    assert workers * device_ms >= cpu_ms + device_ms
    assert workers == 1 or (workers - 1) * device_ms < cpu_ms + device_ms


@pytest.mark.parametrize(
    ("machine", "loads", "workers", "why"),
    [
        # the GPU's time against the CPU's around it decides, per GPU and per model
        (h100_host(), [gpu_load(10, 25)], [4], "keep it busy"),
        (h100_host(gpus=2), [gpu_load(10, 25)], [8], "2 GPU(s): 4 worker(s) on each"),
        (h100_host(), [gpu_load(10, 25), gpu_load(10, 5)], [4, 2], "keep it busy"),
        # cores: one per worker, one left to the frontend (4 GPUs x 4 > 15: 3 each)
        (h100_host(gpus=4), [gpu_load(10, 25)], [12], "cut to [3] per GPU"),
        (h100_host(cores=6), [gpu_load(10, 25), gpu_load(10, 5)], [3, 2], "cut to [3, 2]"),
        # fewer cores than GPUs: one worker per core, the other GPUs idle
        (h100_host(cores=3, gpus=4), [gpu_load(10, 25)], [2], "some GPUs stay idle"),
        (h100_host(cores=1, gpus=2), [gpu_load(10, 25)], [1], "some GPUs stay idle"),
        # GPU memory: 90 % of 80 GiB holds 4 workers of 16.5 GiB, not 5
        (h100_host(), [gpu_load(2, 20, gpu_gib=16)], [4], "GPU memory"),
        (h100_host(), [gpu_load(10, 25, gpu_gib=100)], [1], "may run out of GPU memory"),
        # host memory: a GPU worker's 1,216 MiB, 4 of them in half of 8 GiB only 3
        (h100_host(memory=8 * GIB), [gpu_load(10, 25)], [3], "half of 8192 MiB"),
    ],
)
def test_gpu_workers_follow_the_device_load_within_cores_and_memories(
    machine: Machine, loads: list[rules.DeviceLoad], workers: list[int], why: str
) -> None:
    got, reasons = rules.shared_workers(
        machine, [rules.GPU_WORKER_HOST_BYTES] * len(loads), loads=loads
    )
    assert got == workers, reasons
    assert any(why in reason for reason in reasons), reasons
    assert sum(got) <= max(1, machine.cores - rules.FRONTEND_CORES)


def test_workers_the_config_states_take_their_cores_from_the_gpu_workers() -> None:
    got, reasons = rules.shared_workers(
        h100_host(cores=8), [rules.GPU_WORKER_HOST_BYTES], stated=4, loads=[gpu_load(10, 25)]
    )
    assert got == [3] and any("4 to the config's workers" in reason for reason in reasons)


def archive(path: Path, handler: dict[str, object] | None) -> Path:
    """A .mar with a model folder and, when given, a model config with that handler section."""
    import zipfile

    import yaml

    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("model/config.json", "{}")
        if handler is not None:
            mar.writestr("model-config.yaml", yaml.safe_dump({"handler": handler}))
            manifest = {"model": {"modelName": "bert", "configFile": "model-config.yaml"}}
            mar.writestr(probe.MANIFEST, json.dumps(manifest))
    return path


@pytest.mark.usefixtures("machine_of_8_cores")
def test_the_start_sizes_gpu_workers_from_the_measured_load(
    gpu_loads: list[int], tmp_path: Path
) -> None:
    """On GPUs: one thread each, the measured load in the report, reasons printed."""
    archive(tmp_path / "bert.mar", {"device": "auto"})
    resolved = sizing.resolve(effective_properties({"model_store": str(tmp_path)}))
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    assert entry["minWorkers"] == 2 * SERVED_LOAD.busy_workers
    assert resolved.torch_threads == 1
    assert sizing.report(resolved)["device_loads"]["bert:1.0"]["device_s"] == 0.010
    assert any("keep it busy" in reason for reason in resolved.reasons)
    assert gpu_loads == [8]


@pytest.mark.usefixtures("gpu_loads")
def test_a_gpu_worker_is_budgeted_the_host_memory_measured_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """1,216 MiB each (docs/bench/h100/results.json), not a CPU worker's measured memory: in
    half of 4 GiB, one GPU worker fits where three CPU workers of 640 MiB would."""
    archive(tmp_path / "bert.mar", {})
    monkeypatch.setattr(sizing, "read_machine", lambda gpus: Machine(8, 4 * GIB, gpus, 80 * GIB))
    resolved = sizing.resolve(effective_properties({"model_store": str(tmp_path)}))
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    assert entry["minWorkers"] == 1
    assert rules.workers_for(Machine(8, 4 * GIB, 0), WORKER.peak_bytes)[0] == 3


def test_a_model_on_device_cpu_is_sized_as_a_cpu_model(
    gpu_loads: list[int], tmp_path: Path
) -> None:
    """``device: cpu`` on a machine with GPUs: a worker per core, threads as on a CPU, no
    GPU measurement."""
    archive(tmp_path / "bert.mar", {"device": "cpu"})
    resolved = sizing.resolve(effective_properties({"model_store": str(tmp_path)}))
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    assert entry["minWorkers"] == 8
    assert gpu_loads == [] and resolved.device_loads == {}
    assert any("one worker per core" in reason for reason in resolved.reasons)


def test_gpu_and_cpu_models_share_the_cores(gpu_loads: list[int], tmp_path: Path) -> None:
    """A GPU model takes its workers first (3 per GPU on 2 GPUs), a ``device: cpu`` model one
    worker per core left: 8 cores less 6 workers."""
    archive(tmp_path / "gpu.mar", {})
    archive(tmp_path / "cpu.mar", {"device": "cpu"})
    models = {"g": {"1": {"marName": "gpu.mar"}}, "c": {"1": {"marName": "cpu.mar"}}}
    properties = effective_properties(
        {
            "models": json.dumps(models),
            "model_store": str(tmp_path),
            "load_models": "gpu.mar,cpu.mar",
        }
    )
    resolved = sizing.resolve(properties)
    chosen = json.loads(resolved.properties["models"])
    assert (chosen["g"]["1"]["minWorkers"], chosen["c"]["1"]["minWorkers"]) == (6, 2)
    assert set(resolved.device_loads) == {"g:1"}
    assert any(reason.startswith("c:1 on the CPU") for reason in resolved.reasons)


def stand_in_batch(cpu_s: float, device_s: float, burn: bool = True) -> Callable[[], list[float]]:
    """A batch on a stand-in device: its CPU side burns ``cpu_s`` of this thread's CPU (or,
    ``burn=False``, sleeps that long: a core of its own that this shared machine cannot
    promise), its pass on the device costs ``device_s`` of wall time and no CPU (a sleep), and
    it reports the pass's milliseconds as ``classify`` reports its forward passes."""

    def run() -> list[float]:
        if burn:
            burnt = time.thread_time()
            while time.thread_time() - burnt < cpu_s:
                pass
        else:
            time.sleep(cpu_s)
        started = time.perf_counter()
        time.sleep(device_s)
        return [(time.perf_counter() - started) * 1e3]

    return run


def device_busy(workers: int, cpu_s: float, device_s: float, seconds: float = 1.2) -> float:
    """The stand-in device's busy share while ``workers`` threads loop: their CPU side (a core
    each: a sleep, so the threads do not queue for this machine's cores), then their pass,
    one at a time on the device (a lock held for ``device_s``)."""
    device = threading.Lock()
    passes: list[tuple[float, float]] = []
    stop = time.perf_counter() + seconds

    def worker() -> None:
        while time.perf_counter() < stop:
            time.sleep(cpu_s)
            with device:
                started = time.perf_counter()
                time.sleep(device_s)
                passes.append((started, time.perf_counter()))

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    begin, end = stop - seconds + 0.2, stop  # after a warm-up of 0.2 s
    held = sum(max(0.0, min(b, end) - max(a, begin)) for a, b in passes)
    return held / (end - begin)


def test_the_measurement_splits_a_batch_into_its_device_and_cpu_time() -> None:
    """The stand-in's pass is the device's time; the CPU it burns is the worker's (more where
    other processes hold this machine's cores: the worker waits for them just the same)."""
    device_s, cpu_s = probe.device_and_cpu_seconds(stand_in_batch(0.015, 0.030), seconds=0.3)
    assert 0.030 <= device_s < 0.045
    assert cpu_s >= 0.014


def test_the_rule_keeps_a_stand_in_device_busy() -> None:
    """Measured as the start measures a GPU, a stand-in device of 30 ms a pass beside 15 ms of
    a worker's own: two workers keep it busy, one leaves it idle a third of the time."""
    device_s, cpu_s = probe.device_and_cpu_seconds(
        stand_in_batch(0.015, 0.030, burn=False), seconds=0.3
    )
    workers = rules.DeviceLoad(8, device_s, cpu_s, GIB, 0).busy_workers
    assert workers == 2, (device_s, cpu_s)
    assert device_busy(workers, cpu_s, device_s) >= 0.9
    assert device_busy(workers - 1, cpu_s, device_s) < 0.75


def simulated_busy(workers: int, cpu_s: float, device_s: float, batches: int = 5000) -> float:
    """The device's busy share when ``workers`` each loop CPU side then pass, the passes
    queued first come first served on one device (an exact event simulation)."""
    ready = [cpu_s] * workers
    device_free = 0.0
    for _ in range(batches):
        turn = min(range(workers), key=lambda i: ready[i])
        device_free = max(ready[turn], device_free) + device_s
        ready[turn] = device_free + cpu_s
    return batches * device_s / device_free


@pytest.mark.parametrize("cpu_per_device", [0.3, 0.5, 1.5, 2.5, 4.2, 7.7])
def test_the_rule_is_the_fewest_workers_that_keep_the_device_busy(cpu_per_device: float) -> None:
    load = gpu_load(device_ms=10, cpu_ms=10 * cpu_per_device)
    workers = load.busy_workers
    assert simulated_busy(workers, load.cpu_s, load.device_s) >= 0.99
    assert workers > 1, "every case has CPU work beside the device's"
    assert simulated_busy(workers - 1, load.cpu_s, load.device_s) < 0.99


def test_a_pass_its_launches_pace_gets_the_workers_that_fill_the_gpu_between_its_kernels() -> None:
    """A pass of 12 ms whose kernels keep the GPU busy 4 ms of it (a small or bf16 model: the
    worker's Python launching kernels sets the pace; on the H200 a bert-base batch of 64 in
    fp32 kept it busy 21.0 of 22.9 ms, docs/gpu): the GPU is free for other workers the rest
    of the time, so 4 workers keep it busy where the pass's wall time alone says 2."""
    load = rules.DeviceLoad(32, 0.012, 0.002, GIB, 0, kernel_s=0.004)
    workers = load.busy_workers
    assert workers == 4
    own = load.cpu_s + load.device_s - load.gpu_s  # a worker's cycle beside the GPU's part
    assert simulated_busy(workers, own, load.gpu_s) >= 0.99
    assert simulated_busy(workers - 1, own, load.gpu_s) < 0.9
    assert load.gpu_texts_per_s == pytest.approx(32 / 0.004)
    unprofiled = replace(load, kernel_s=None)
    assert (unprofiled.busy_workers, unprofiled.gpu_texts_per_s) == (2, pytest.approx(32 / 0.012))


def test_a_machine_without_cuda_times_no_kernels() -> None:
    """Where the profiler sees no CUDA kernels the start falls back to the pass's wall time."""
    assert probe.kernel_seconds(lambda: sum(range(1000))) is None


def test_a_profiler_that_fails_leaves_the_wall_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU whose profiler raises (CUPTI held by another tool) must not fail the start's
    measurement: the kernels' time is then unknown, and the rule takes the pass's wall time."""
    import torch
    import torch.profiler

    def refused(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.profiler, "profile", refused)
    ran: list[int] = []
    assert probe.kernel_seconds(lambda: ran.append(1)) is None
    assert "MULTIPLE_SUBSCRIBERS" in capsys.readouterr().err


@pytest.mark.skipif(not probe.gpu_count(), reason="needs a CUDA GPU")
def test_a_batch_is_measured_on_the_gpu(tiny_model_dir: Path) -> None:
    """The real measurement: the pass's time, the CPU's around it, the worker's GPU memory."""
    from handler.model import load_model
    from handler.settings import HandlerSettings

    settings = HandlerSettings()
    loaded = load_model(tiny_model_dir, settings, 0)
    load = probe.measure_device_load(loaded, settings, 16)
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert load.batch_size == 16 and load.device_s > 0 and load.cpu_s > 0
    assert load.gpu_bytes > weights and load.context_bytes > 0
    assert load.busy_workers >= 1


def resolve_stating(overrides: dict[str, str]) -> tuple[int, str]:
    """The shipped config with ``overrides`` on the 8-core machine: (queue, vmargs)."""
    resolved = sizing.resolve(effective_properties(overrides), gpus=0)
    return int(resolved.properties["job_queue_size"]), resolved.properties["vmargs"]


def test_a_stated_queue_gets_a_heap_that_holds_it(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]],
) -> None:
    queue, vmargs = resolve_stating({"job_queue_size": "5000"})
    assert queue == 5000
    assert rules.heap_mib_in(vmargs) == rules.heap_holding(5000 * REQUEST, rules.G1, REQUEST)


def test_a_stated_queue_the_memory_cannot_hold_is_kept_and_the_heap_capped(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizing, "read_machine", lambda gpus: Machine(2, 2 * GIB, gpus))
    resolved = sizing.resolve(effective_properties({"job_queue_size": "100000"}), gpus=0)
    assert resolved.properties["job_queue_size"] == "100000"
    heap = rules.heap_mib_in(resolved.properties["vmargs"])
    assert heap is not None and heap < 2048
    assert any("fewer than the stated queue" in reason for reason in resolved.reasons)


@pytest.mark.parametrize(
    ("vmargs", "heap_mb"),
    [
        ("-Xmx1g", 1024),
        ("-XX:MaxHeapSize=1073741824", 1024),
        ("-XX:MaxRAMPercentage=0.5", int(128 * GIB * 0.005 // MIB)),
    ],
)
def test_a_stated_heap_is_kept_and_the_queue_cut_to_what_it_holds(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]], vmargs: str, heap_mb: int
) -> None:
    """-Xmx, -XX:MaxHeapSize or MaxRAMPercentage: no -Xmx is added to override it, and the
    patient minute (8 x 46 x 60 = 22,080) is cut to what that heap holds."""
    queue, got = resolve_stating({"vmargs": vmargs})
    assert got == vmargs
    taken = rules.heap_request_bytes(REQUEST, rules.G1, heap_mb)
    assert queue == int((heap_mb - rules.BASE_HEAP_MIB) * MIB / taken) < 8 * 46 * 60


def test_a_stated_heap_larger_than_the_minute_keeps_the_minute(
    machine_of_8_cores: list[tuple[tuple[int, ...], int]],
) -> None:
    queue, vmargs = resolve_stating({"vmargs": "-Xmx24g"})
    assert (queue, vmargs) == (8 * 46 * 60, "-Xmx24g")


def sized_pod(
    monkeypatch: pytest.MonkeyPatch,
    pod: Machine,
    texts_per_s: float,
    worker: probe.WorkerMemory = WORKER,
) -> tuple[int, int, int]:
    """The shipped config on ``pod`` whose worker measures ``worker``: (workers, queue, heap MiB)."""
    monkeypatch.setattr(sizing, "read_machine", lambda gpus: pod)
    monkeypatch.setattr(sizing, "measured_rates", lambda *args: dict.fromkeys(args[2], texts_per_s))
    monkeypatch.setattr(sizing, "measured_precision", fp32_chosen)
    monkeypatch.setattr(sizing, "measured_memory", lambda mar, mtime_ns, **_: worker)
    resolved = sizing.resolve(effective_properties(), gpus=0)
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    heap = rules.heap_mib_in(resolved.properties["vmargs"])
    assert heap is not None
    return entry["minWorkers"], int(resolved.properties["job_queue_size"]), heap


def recorded_worker() -> probe.WorkerMemory:
    """The worker deploy/image-test.json's start budgeted ("a worker holds N MiB"), as the peak
    that budget came from."""
    record = json.loads((ROOT / "deploy" / "image-test.json").read_text())
    (line,) = [line for line in record["sizing"] if "a worker holds" in line]
    budget = int(line.split("a worker holds ")[1].split()[0]) * MIB
    return probe.WorkerMemory(round(budget / sizing.MEASURED_WORKER_HEADROOM), 0, 0)


@pytest.mark.parametrize("texts_per_s", [124.0, 200.0])
def test_the_shipped_pod_fits_its_limit_and_queues_the_image_tests_clients(
    monkeypatch: pytest.MonkeyPatch, texts_per_s: float
) -> None:
    """deploy/k8s/deployment.yaml's container (its limits) with the shipped archive and the
    worker its image test measured: 1 worker (a second does not fit in half), workers, heap,
    the JVM's non-heap memory and the slack within the limit, and a queue of 1 MiB requests
    that still holds the image test's 256 patient clients."""
    from tests.unit.test_sizing_limits import deployment_limits

    cpus, limit = deployment_limits()
    pod = Machine(cores=int(cpus), memory_bytes=limit, gpus=0, cpus=cpus)
    worker = recorded_worker()
    workers, queue, heap = sized_pod(monkeypatch, pod, texts_per_s, worker)
    assert workers == 1
    planned = heap * MIB + workers * sizing.budgeted_bytes(worker) + rules.FRONTEND_NON_HEAP_BYTES
    assert planned + rules.SERVER_SLACK_BYTES <= limit
    assert 256 <= queue <= int(workers * texts_per_s * 60)
    assert (heap - rules.BASE_HEAP_MIB) * MIB >= queue * REQUEST


def test_an_8_core_4_gib_pod_fits_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 cores and 4 GiB: the workers are cut to what half the memory holds at the memory a
    worker measured with its headroom (640 MiB x 1.15: 2, not 8, nor the 5 a .mar + 300 MiB
    estimate gave), and workers, heap and the JVM's non-heap memory fit in the limit."""
    pod = Machine(cores=8, memory_bytes=4 * GIB, gpus=0)
    workers, queue, heap = sized_pod(monkeypatch, pod, 100.0)
    assert workers == 2048 // (sizing.budgeted_bytes(WORKER) // MIB) == 2
    assert (
        heap + workers * sizing.budgeted_bytes(WORKER) / MIB + rules.FRONTEND_NON_HEAP_BYTES / MIB
        <= 4096
    )
    assert (heap - rules.BASE_HEAP_MIB) * MIB >= queue * REQUEST


def fake_host(root: Path, packages: int, cores: int, threads: int) -> Path:
    """sysfs topology of ``packages`` x ``cores`` x ``threads`` logical CPUs, numbered as
    Linux numbers them (each core's second thread after every core's first)."""
    count = packages * cores * threads
    for cpu in range(count):
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        first = cpu % (packages * cores)
        (folder / "physical_package_id").write_text(f"{first // cores}\n")
        (folder / "core_id").write_text(f"{first % cores}\n")
    return root


def test_physical_cores_count_hyperthreads_once(tmp_path: Path) -> None:
    topology = fake_host(tmp_path, packages=2, cores=16, threads=2)
    assert probe.physical_cores(set(range(64)), topology) == 32
    assert probe.physical_cores({0, 32}, topology) == 1, "two threads of one core"
    assert probe.physical_cores({0, 16}, topology) == 2, "core 0 of each package"
    assert probe.physical_cores({0, 99}, topology) == 2, "no topology: a core of its own"


@pytest.mark.parametrize(
    ("quota", "workers", "threads"),
    [(None, 32, 2), ("1600000 100000", 16, 1), ("6400000 100000", 32, 2)],
)
def test_a_64_thread_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota: str | None, workers: int, threads: int
) -> None:
    """2 sockets x 16 cores x 2 threads, all 64 in the affinity, 256 GiB: a worker per
    physical core (or per core of the cgroup quota), the CPUs paid for shared as threads, the
    queue in requests what the heap holds under the compressed-pointer limit."""
    topology = fake_host(tmp_path / "cpu", packages=2, cores=16, threads=2)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(f"{256 * GIB}\n")
    (cgroup / "cpu.max").write_text(f"{quota or 'max 100000'}\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    read = functools.partial(
        probe.read_machine, cgroup=cgroup, topology=topology, physical=512 * GIB
    )
    monkeypatch.setattr(sizing, "read_machine", read)
    monkeypatch.setattr(sizing, "measured_rates", lambda *args: dict.fromkeys(args[2], 50.0))
    monkeypatch.setattr(sizing, "measured_precision", fp32_chosen)
    monkeypatch.setattr(sizing, "measured_memory", lambda mar, mtime_ns, **_: WORKER)
    resolved = sizing.resolve(effective_properties(), gpus=0)
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    assert (entry["minWorkers"], resolved.torch_threads) == (workers, threads)
    heap = rules.heap_mib_in(resolved.properties["vmargs"])
    assert heap == rules.COMPRESSED_OOPS_MIB
    taken = rules.heap_request_bytes(REQUEST, rules.G1, heap)
    queue = int((heap - rules.BASE_HEAP_MIB) * MIB / taken)
    assert resolved.properties["job_queue_size"] == str(queue) and queue < workers * 50 * 60


FAKE_HANDLER = {
    "handler/__init__.py": "",
    "handler/settings.py": (
        "class HandlerSettings:\n"
        "    max_length = 8\n"
        "    precision = 'fp32'\n"
        "    @classmethod\n"
        "    def from_mapping(cls, raw):\n"
        "        return cls()\n"
    ),
    "handler/precision.py": "AUTO = 'auto'\n",
    "handler/model.py": (
        "class Loaded:\n"
        "    max_batch_tokens = 0\n"
        "def load_model(folder, settings, device):\n"
        "    return Loaded()\n"
    ),
}


def fake_archive(path: Path, seconds_per_batch: float) -> Path:
    """A .mar whose handler code classifies a batch in ``seconds_per_batch``."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in FAKE_HANDLER.items():
            archive.writestr(name, text)
        archive.writestr(
            "handler/inference.py",
            "import time\n"
            "def classify(loaded, texts, max_length, max_batch_tokens):\n"
            f"    time.sleep({seconds_per_batch})\n",
        )
        archive.writestr("model/config.json", "{}")
    return path


def test_a_model_that_cannot_load_leaves_its_traceback_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The start's measurement is where a model that cannot load fails first (in the image,
    before TorchServe runs): its whole traceback goes to stderr, the container's log, and the
    refusal names the error's last line."""
    broken = tmp_path / "broken.mar"
    with zipfile.ZipFile(broken, "w") as archive:
        for name, text in FAKE_HANDLER.items():
            if name == "handler/model.py":
                text = (
                    "def load_model(folder, settings, device):\n"
                    "    raise ValueError('model type `bert-next` is not known.\\n\\nUpgrade.')\n"
                )
            archive.writestr(name, text)
        archive.writestr("handler/inference.py", "def classify(*args):\n    pass\n")
        archive.writestr("model/config.json", "{}")
    with pytest.raises(RuntimeError, match="ValueError: model type `bert-next` is not known.$"):
        probe.in_fresh_process("rates", broken, [[8], 1, 0])
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in load_model" in err


def test_each_archive_is_measured_on_its_own_code_in_a_fresh_process(tmp_path: Path) -> None:
    """Two archives measured one after the other from this process (which has imported the
    checkout's handler) each run their own handler code: a slow one and a fast one."""
    import handler.inference  # noqa: F401  the checkout's copy, as a test session has it

    slow = fake_archive(tmp_path / "slow.mar", 0.005)
    fast = fake_archive(tmp_path / "fast.mar", 0.0002)
    slow_rates = probe.in_fresh_process("rates", slow, [[32], 1, 0])["32"]
    fast_rates = probe.in_fresh_process("rates", fast, [[32], 1, 0])["32"]
    assert len(slow_rates) == len(fast_rates) == probe.ROUNDS
    assert max(slow_rates) < 32 / 0.005 * 1.1
    assert min(fast_rates) > 5 * max(slow_rates)
    with pytest.raises(RuntimeError, match="fresh process"):
        probe.measure_rates(slow, (32,), threads=1, gpus=0)
