"""The machine the server starts on, as sizing sees it: the CPUs this process is paid for, the
physical cores under them, the memory and the GPUs. Read from sysfs and the cgroup files only
(no measurement); every value may be stated instead (``bert_serve_server.stated``).

- **CPUs paid for** (``Machine.cpus``, logical CPUs: what a Kubernetes ``cpu`` counts): the CPUs
  of this process's affinity, capped by a cgroup CPU quota (``cpu.max``, ``cpu.cfs_quota_us``);
  with no quota, by the cgroup's CPU request (``cpu.weight`` or ``cpu.shares``, which the
  kubelet sets from the pod's request), so a pod without a limit is sized for what it asked for,
  not for the whole node. The kernel's defaults (weight 100, shares 1024) read as no request.
- **Cores** (``Machine.cores``): the physical cores those CPUs sit on (sysfs ``topology``:
  hyperthreads of one core share its units), never more than the CPUs paid for. Workers follow
  the cores; the torch threads follow the CPUs (``rules.threads_for``).
- **Memory**: the cgroup limit, else the machine's.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
CPU_TOPOLOGY = Path("/sys/devices/system/cpu")
DEFAULT_CPU_WEIGHT = 100
"""cgroup v2's ``cpu.weight`` when nothing set it: read as no CPU request."""
DEFAULT_CPU_SHARES = 1024
"""cgroup v1's ``cpu.shares`` when nothing set it: read as no CPU request."""


@dataclass(frozen=True)
class Machine:
    cores: float
    """Physical cores this process may use (never more than ``cpus``)."""
    memory_bytes: int
    gpus: int
    gpu_memory_bytes: int = 0
    """The smallest of the GPUs' memories (0: no GPU, or not known)."""
    cpus: float = 0.0
    """Logical CPUs paid for (hyperthreads counted); 0: as many as ``cores``."""
    source: tuple[str, ...] = ()
    """How each value was read or stated, for the reasons."""

    @property
    def logical_cpus(self) -> float:
        return self.cpus or self.cores


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


def read_machine(gpus: int, cgroup: Path = CGROUP, topology: Path = CPU_TOPOLOGY) -> Machine:
    """The CPUs paid for and the physical cores under them (never more than those CPUs); the
    cgroup's memory limit, else the machine's; with ``gpus`` of its GPUs (their memory read
    here)."""
    affinity = os.sched_getaffinity(0)
    cpus, cpu_source = paid_cpus(len(affinity), cgroup)
    cores = min(float(physical_cores(affinity, topology)), cpus)
    limit = cgroup_memory(cgroup)
    memory = limit or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    memory_source = "cgroup limit" if limit else "the machine's, no cgroup limit"
    gpu_memory = 0
    if gpus:
        import torch

        gpu_memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus))
    return Machine(
        cores=cores,
        memory_bytes=memory,
        gpus=gpus,
        gpu_memory_bytes=gpu_memory,
        cpus=cpus,
        source=(
            f"machine: {cpu_source}, {cores:g} physical core(s) under them",
            f"machine: {memory // 2**20} MiB of memory ({memory_source})",
        ),
    )


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def serving_gpus(properties: dict[str, str]) -> int:
    """The GPUs TorchServe hands to workers: this machine's, capped by ``number_of_gpu``."""
    return min(gpu_count(), int(properties.get("number_of_gpu", sys.maxsize)))
