"""The limits the sizing works within: the memory as the pod may use it (probe.py: the least of
the cgroup limits, the physical memory and a stated memory), the slack the plan leaves in it, the
largest body the handler accepts (rules.handler_body_bytes) and what a queued request holds in the
frontend's heap. Cgroup files, machines and measurements are faked; no model is loaded."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bert_serve_server import probe, rules, sizing
from bert_serve_server.config import effective_properties
from bert_serve_server.rules import Machine
from bert_serve_server.sizing import Stated, quantity_bytes, with_stated

from tests.conftest import ROOT

GIB = 2**30
MIB = 2**20
TIB = 2**40


def cgroup_v2(root: Path, limits: dict[str, str]) -> Path:
    """A cgroup v2 tree: ``memory.max`` in each folder of ``limits`` (relative to ``root``)."""
    for folder, limit in limits.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "memory.max").write_text(f"{limit}\n")
    return root


def machine_of(cgroup: Path, own: str = "/", physical: int = 8 * GIB) -> Machine:
    return probe.read_machine(0, cgroup, cgroup / "no-topology", own=(own, "/"), physical=physical)


def test_a_cgroup_limit_larger_than_the_machine_is_not_memory_the_pod_has(tmp_path: Path) -> None:
    """A fake 1 TiB memory.max on an 8 GiB machine: sized for 8 GiB, and said so (before: 1 TiB,
    'cgroup limit')."""
    machine = machine_of(cgroup_v2(tmp_path, {".": str(TIB)}))
    assert machine.memory_bytes == 8 * GIB
    (line,) = [line for line in machine.source if "of memory" in line]
    assert "8192 MiB of memory, bound by the physical memory" in line
    assert "the cgroup limit 1048576 MiB" in line


def test_the_least_limit_of_the_cgroups_above_this_one_binds(tmp_path: Path) -> None:
    """A pod's cgroup limits its containers too: this process's cgroup states none, the pod's
    above it 1536 MiB. v1's memory controller likewise (before: the root's file alone)."""
    cgroup = cgroup_v2(tmp_path / "v2", {".": "max", "pod": str(1536 * MIB), "pod/ctr": "max"})
    machine = machine_of(cgroup, own="/pod/ctr")
    assert machine.memory_bytes == 1536 * MIB
    assert "bound by the cgroup limit" in machine.source[-1]
    v1 = tmp_path / "v1" / "memory"
    (v1 / "pod" / "ctr").mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "pod" / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (v1 / "pod" / "ctr" / "memory.limit_in_bytes").write_text(f"{3 * GIB}\n")
    assert probe.cgroup_memory(tmp_path / "v1", ("/", "/pod/ctr")) == 2 * GIB
    assert probe.cgroup_memory(tmp_path / "v1", ("/", "/")) is None


def test_own_cgroups_are_read_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("12:memory:/kubepods/pod1/ctr\n2:cpu,cpuacct:/x\n0::/kubepods/pod1/ctr\n")
    assert probe.own_cgroups(proc) == ("/kubepods/pod1/ctr", "/kubepods/pod1/ctr")
    assert probe.own_cgroups(tmp_path / "none") == ("/", "/")


@pytest.mark.parametrize(
    ("stated", "memory", "bound"),
    [
        (1 * GIB, 1 * GIB, rules.STATED),
        (4 * GIB, 1536 * MIB, rules.CGROUP_LIMIT),
        (64 * GIB, 1536 * MIB, rules.CGROUP_LIMIT),
    ],
)
def test_a_stated_memory_only_lowers_what_the_pod_may_use(
    tmp_path: Path, stated: int, memory: int, bound: str
) -> None:
    """BERT_SERVE_MEMORY is one more bound: the least of it, the cgroup limit and the physical
    memory is sized for (before, a stated 64 GiB on a 1536 MiB pod was sized as 64 GiB)."""
    machine = machine_of(cgroup_v2(tmp_path, {".": str(1536 * MIB)}))
    sized, _ = with_stated(machine, {}, Stated(memory_bytes=stated))
    assert sized.memory_bytes == memory
    assert f"bound by {bound}" in sized.source[-1]


def test_no_limit_says_the_node_sizes_the_pod(tmp_path: Path) -> None:
    """No memory limit: the physical memory, with the advice to state the pod's request."""
    machine = machine_of(cgroup_v2(tmp_path, {".": "max"}), physical=256 * GIB)
    assert machine.memory_bytes == 256 * GIB
    assert "no cgroup limit" in machine.source[-1] and "BERT_SERVE_MEMORY" in machine.source[-1]


def test_the_reasons_name_the_bound(tmp_path: Path) -> None:
    """The start's why-lines (Resolved.reasons begins with machine.source) say it."""
    machine = machine_of(cgroup_v2(tmp_path, {".": str(TIB)}), physical=2 * GIB)
    assert json.dumps(machine.source).count("bound by the physical memory") == 1


# The largest body the handler accepts, and the body limit the start sets by it.

EMOJI = "\U0001f600"
"""A character past U+FFFF: 4 bytes in a Python str of such characters, 12 JSON-escaped."""


def largest_lists(max_chars: int = rules.DEFAULT_MAX_CHARS) -> dict[str, bytes]:
    """Valid lists of the most texts of the most characters, each escaped at its longest."""
    text = EMOJI * max_chars
    texts = rules.DEFAULT_MAX_TEXTS
    return {
        "texts": json.dumps({"texts": [text] * texts}).encode(),
        "pairs": json.dumps({"texts": [{"text": text, "text_pair": text}] * texts}).encode(),
        "instances": json.dumps({"instances": [text] * texts}).encode(),
    }


@pytest.mark.parametrize("kind", ["texts", "pairs", "instances"])
def test_the_largest_valid_list_is_within_the_handlers_largest_body(kind: str) -> None:
    """64 texts of 10,000 emoji are 7.7 MB of JSON (12 bytes a character), 64 pairs of them
    15.4 MB: the handler accepts each, and the body rule counts them (before: 6 bytes a
    character, 3.8 MB, so the body limit the start set refused them)."""
    from handler.native import TextList, decode_request
    from handler.values import ValidText

    body = largest_lists()[kind]
    decoded = decode_request(
        {"body": body}, "application/json", rules.DEFAULT_MAX_CHARS, rules.DEFAULT_MAX_TEXTS
    )
    assert isinstance(decoded, TextList) and len(decoded.items) == rules.DEFAULT_MAX_TEXTS
    assert all(isinstance(item, ValidText) for item in decoded.items)
    assert len(body) <= rules.handler_body_bytes()
    assert len(body) > 64 * 10_000 * 6 + rules.REQUEST_OVERHEAD_BYTES, "the old rule's body"


def test_the_start_sets_a_body_limit_that_admits_the_largest_valid_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A config that states no max_request_size gets the handler's largest body, which the
    largest valid list (64 pairs of 10,000 emoji) is within."""
    fake_start(monkeypatch, Machine(cores=8, memory_bytes=128 * GIB, gpus=0, cpus=8))
    properties = {k: v for k, v in effective_properties().items() if k != "max_request_size"}
    resolved = sizing.resolve(properties, gpus=0)
    admitted = int(resolved.properties["max_request_size"])
    assert max(len(body) for body in largest_lists().values()) <= admitted


WORKER = probe.WorkerMemory(peak_bytes=490 * MIB, uss_bytes=470 * MIB, pss_bytes=480 * MIB)


def fp32_chosen(*args: object) -> probe.PrecisionChoice:
    """The precision ``auto`` settles on, as a start would measure it (not measured here)."""
    return probe.PrecisionChoice("fp32", "fp32: not measured in this test")


def fake_start(
    monkeypatch: pytest.MonkeyPatch,
    machine: Machine,
    worker: probe.WorkerMemory = WORKER,
    texts_per_s: float = 186.4,
) -> None:
    """A start on ``machine`` whose worker measures ``worker`` and classifies ``texts_per_s``."""
    monkeypatch.setattr(sizing, "read_machine", lambda gpus: machine)
    monkeypatch.setattr(sizing, "measured_rates", lambda *args: dict.fromkeys(args[2], texts_per_s))
    monkeypatch.setattr(sizing, "measured_precision", fp32_chosen)
    monkeypatch.setattr(sizing, "measured_memory", lambda mar, mtime_ns, **_: worker)


# The slack the plan leaves, on the Deployment's own numbers.

DEPLOYMENT = ROOT / "deploy" / "k8s" / "deployment.yaml"
IMAGE_RECORD = ROOT / "deploy" / "image-test.json"
PROBES_AT_ONCE = 4
"""Readiness and liveness, and while stopping the drain and ``torchserve --stop`` beside them."""


def deployment_limits() -> tuple[float, int]:
    """The torchserve container's CPU and memory limits in deploy/k8s/deployment.yaml."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "torchserve"
    ]
    limits = container["resources"]["limits"]
    return float(limits["cpu"]), quantity_bytes(limits["memory"])


def probe_peak_bytes() -> int:
    """The peak RSS of one probe, ``python -m bert_serve_server ready --live`` (no server
    here: it answers not live at once, having imported what it imports)."""
    script = (
        "import resource, subprocess, sys\n"
        "subprocess.run([sys.executable, '-m', 'bert_serve_server', 'ready', '--live'],"
        " capture_output=True, timeout=60)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=True
    )
    return int(done.stdout.split()[-1]) * 1024


@pytest.mark.parametrize("worker_mib", [420, 563, 640])
def test_the_deployments_plan_leaves_the_slack_under_its_limit(
    monkeypatch: pytest.MonkeyPatch, worker_mib: int
) -> None:
    """deploy/k8s/deployment.yaml's limits, a worker budgeted at ``worker_mib`` (the image
    record's was 563): workers, heap and the JVM's non-heap memory stay under the limit by
    rules.SERVER_SLACK_BYTES, which holds the processes beside them (before, 563 + 781 + 192 =
    1536: nothing left for the launcher and the probes)."""
    cpus, limit = deployment_limits()
    worker = probe.WorkerMemory(round(worker_mib * MIB / sizing.MEASURED_WORKER_HEADROOM), 0, 0)
    fake_start(monkeypatch, Machine(cores=cpus, memory_bytes=limit, gpus=0, cpus=cpus), worker)
    resolved = sizing.resolve(effective_properties(), gpus=0)
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    heap = rules.heap_mib_in(resolved.properties["vmargs"])
    assert heap is not None
    planned = (
        heap * MIB
        + entry["minWorkers"] * sizing.budgeted_bytes(worker)
        + rules.FRONTEND_NON_HEAP_BYTES
    )
    assert limit - planned >= rules.SERVER_SLACK_BYTES
    record = json.loads(IMAGE_RECORD.read_text())
    beside = sum(
        p["rss_mib"] * MIB for p in record["processes"] if p["role"] not in ("frontend", "worker")
    )
    assert beside + PROBES_AT_ONCE * probe_peak_bytes() <= rules.SERVER_SLACK_BYTES


# What a queued request takes of the frontend's heap, by collector.


@pytest.mark.parametrize(
    ("heap_mib", "region_mib"),
    [(780, 1), (2048, 1), (3072, 2), (4096, 2), (4097, 4), (8192, 4), (8193, 8), (31 * 1024, 16)],
)
def test_g1_regions_are_the_jvms_own(heap_mib: int, region_mib: int) -> None:
    """OpenJDK 17's G1HeapRegionSize for each -Xmx (java -Xmx... -XX:+UseG1GC
    -XX:+PrintFlagsFinal -version), and a stated one wins."""
    assert rules.g1_region_bytes(heap_mib) == region_mib * MIB
    assert rules.g1_region_bytes(heap_mib, "-XX:G1HeapRegionSize=8m") == 8 * MIB


def test_a_largest_body_takes_two_regions_of_g1_and_itself_elsewhere() -> None:
    """A 1 MiB body (a byte[] of 1 MiB + 16) is humongous in 1 and 2 MiB regions: 2 MiB; three
    pack into a 4 MiB region. OpenJDK 17 held 387 such arrays in a 780 MiB G1 heap, 579 with
    4 MiB regions, 749 under Serial."""
    request = rules.queued_request_bytes(2**20)
    overhead = rules.REQUEST_OVERHEAD_BYTES
    assert rules.heap_request_bytes(request, rules.G1, 780) == 2 * MIB + overhead
    assert rules.heap_request_bytes(request, rules.G1, 3072) == 2 * MIB + overhead
    assert rules.heap_request_bytes(request, rules.G1, 6144) == math.ceil(4 * MIB / 3) + overhead
    assert rules.heap_request_bytes(request, rules.SERIAL, 780) == request
    small = rules.queued_request_bytes(2**20, max_chars=100, max_texts=1)
    assert rules.heap_request_bytes(small, rules.G1, 780) < 2 * small


@pytest.mark.parametrize(
    ("machine", "vmargs", "gc"),
    [
        (Machine(cores=2, memory_bytes=1536 * MIB, gpus=0, cpus=2), "", rules.SERIAL),
        (Machine(cores=2, memory_bytes=2 * GIB, gpus=0, cpus=2), "", rules.G1),
        (Machine(cores=1, memory_bytes=64 * GIB, gpus=0, cpus=1), "", rules.SERIAL),
        (Machine(cores=1, memory_bytes=64 * GIB, gpus=0), "-XX:+UseG1GC", rules.G1),
        (Machine(cores=8, memory_bytes=64 * GIB, gpus=0), "-XX:+UseParallelGC", "parallel"),
    ],
)
def test_the_collector_is_the_one_the_jvm_runs(machine: Machine, vmargs: str, gc: str) -> None:
    """The JVM's own choice (G1 from 2 CPUs and 1792 MiB: HotSpot's server-class machine),
    unless the JVM arguments state one."""
    assert rules.jvm_gc(machine, vmargs) == gc


@pytest.mark.parametrize("memory_gib", [2, 4, 16])
def test_a_g1_heap_holds_its_queue_of_largest_bodies(
    monkeypatch: pytest.MonkeyPatch, memory_gib: int
) -> None:
    """On a machine where the JVM runs G1, the heap holds the whole queue of 1 MiB bodies as G1
    holds them, and the collector is stated with it (before: 1028 KiB each, where G1 takes
    2 MiB for each in heaps up to 4 GiB: a full queue ran the JVM out of heap)."""
    fake_start(monkeypatch, Machine(cores=2, memory_bytes=memory_gib * GIB, gpus=0, cpus=2))
    resolved = sizing.resolve(effective_properties(), gpus=0)
    vmargs = resolved.properties["vmargs"]
    heap = rules.heap_mib_in(vmargs)
    queue = int(resolved.properties["job_queue_size"])
    assert heap is not None
    request = rules.queued_request_bytes(int(resolved.properties["max_request_size"]))
    held = queue * rules.heap_request_bytes(request, rules.G1, heap, vmargs)
    assert (heap - rules.BASE_HEAP_MIB) * MIB >= held
    assert "-XX:+UseG1GC" in vmargs.split()
    assert any("G1's" in reason for reason in resolved.reasons)


# What a worker's memory is measured with: the plan's threads and the largest batch.


def test_the_memory_probe_runs_with_the_threads_the_plan_gives_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 2-CPU pod on 2 cores where one worker fits: measured first at 1 thread (one worker per
    core), then again at the plan's 2 threads for its one worker (before: every CPU of the
    affinity, whatever the plan); a 64-CPU host with room for 32 workers at its 2 threads."""
    for machine, threads, measured_at in (
        (Machine(cores=2, memory_bytes=1536 * MIB, gpus=0, cpus=2), 2, [1, 2]),
        (Machine(cores=32, memory_bytes=256 * GIB, gpus=0, cpus=64), 2, [2]),
    ):
        seen: list[int] = []

        def memory(
            mar: str, mtime_ns: int, seen: list[int] = seen, **_: object
        ) -> probe.WorkerMemory:
            given = probe.PROBE.get()
            assert given is not None
            seen.append(given.threads)
            return probe.WorkerMemory(560 * MIB, 0, 0)

        fake_start(monkeypatch, machine)
        monkeypatch.setattr(sizing, "measured_memory", memory)
        resolved = sizing.resolve(effective_properties(), gpus=0)
        assert resolved.torch_threads == threads
        assert sorted(set(seen)) == measured_at and seen[-1] == threads


def test_the_probe_holds_the_largest_batch_of_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe measures the config's max_request_size, a stated batchSize and at most what
    the machine can give a worker."""
    seen: list[probe.Probe] = []

    def memory(mar: str, mtime_ns: int, **_: object) -> probe.WorkerMemory:
        given = probe.PROBE.get()
        assert given is not None
        seen.append(given)
        return WORKER

    fake_start(monkeypatch, Machine(cores=2, memory_bytes=4 * GIB, gpus=0, cpus=2))
    monkeypatch.setattr(sizing, "measured_memory", memory)
    models = json.loads(effective_properties()["models"])
    models["bert"]["1.0"]["batchSize"] = 16
    models["bert"]["1.0"].pop("sizedAtStart", None)
    sizing.resolve(effective_properties({"models": json.dumps(models)}), gpus=0)
    mar = str(ROOT / "model_store" / "bert.mar")
    assert {(p.batch_size(mar), p.max_request_bytes) for p in seen} == {(16, 2**20)}
    least = rules.FRONTEND_NON_HEAP_BYTES + rules.SERVER_SLACK_BYTES + rules.BASE_HEAP_MIB * MIB
    assert {p.cap_bytes for p in seen} == {4 * GIB - least}


@pytest.mark.parametrize(
    ("max_request", "max_chars", "max_texts", "items"),
    [(2**20, 10_000, 64, 52), (None, 10_000, 64, 64), (2**20, 100, 64, 64), (2000, 10_000, 64, 0)],
)
def test_the_largest_bodies_are_valid_and_within_the_limits(
    max_request: int | None, max_chars: int, max_texts: int, items: int
) -> None:
    """Each body the probe holds is within max_request_size and what the handler accepts, and
    every item of it is valid: as many pairs of max_chars characters as the body holds."""
    from handler.native import TextList, decode_request
    from handler.values import ValidText

    bodies, shown = probe.largest_bodies(3, max_request, max_chars, max_texts)
    assert len(bodies) == 3 and len({id(body) for body in bodies}) == 3, "held apart"
    limit = min(max_request or 2**62, rules.handler_body_bytes(max_chars, max_texts))
    assert all(len(body) <= limit for body in bodies)
    decoded = decode_request({"body": bytes(bodies[0])}, "application/json", max_chars, max_texts)
    if items:
        assert isinstance(decoded, TextList) and len(decoded.items) == items
        assert all(isinstance(item, ValidText) and item.text_pair for item in decoded.items)
        assert all(
            len(item.text) == max_chars for item in decoded.items if isinstance(item, ValidText)
        )
        assert f"{items} text pairs of {max_chars:,} characters" in shown
    else:
        assert isinstance(decoded, ValidText) and "one text of" in shown
    _, texts = probe.decoded_texts(bodies)
    assert len(texts) == 3 * max(items, 1)
