"""The limits the sizing works within: the memory as the pod may use it (machine.py: the least of
the cgroup limits, the physical memory and a stated memory), the slack the plan leaves in it, the
largest body the handler accepts (rules.handler_body_bytes) and what a queued request holds in the
frontend's heap. Cgroup files, machines and measurements are faked; no model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bert_serve_server import machine as host
from bert_serve_server.machine import Machine
from bert_serve_server.stated import Stated, with_stated

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
    return host.read_machine(0, cgroup, cgroup / "no-topology", own=(own, "/"), physical=physical)


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
    assert host.cgroup_memory(tmp_path / "v1", ("/", "/pod/ctr")) == 2 * GIB
    assert host.cgroup_memory(tmp_path / "v1", ("/", "/")) is None


def test_own_cgroups_are_read_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("12:memory:/kubepods/pod1/ctr\n2:cpu,cpuacct:/x\n0::/kubepods/pod1/ctr\n")
    assert host.own_cgroups(proc) == ("/kubepods/pod1/ctr", "/kubepods/pod1/ctr")
    assert host.own_cgroups(tmp_path / "none") == ("/", "/")


@pytest.mark.parametrize(
    ("stated", "memory", "bound"),
    [
        (1 * GIB, 1 * GIB, host.STATED),
        (4 * GIB, 1536 * MIB, host.CGROUP_LIMIT),
        (64 * GIB, 1536 * MIB, host.CGROUP_LIMIT),
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
