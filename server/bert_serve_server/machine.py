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
- **Memory** (``Machine.memory_bytes``): the least of the cgroup's memory limit (the least
  ``memory.max``, or v1 ``memory.limit_in_bytes``, of this process's cgroup and those above it),
  the physical memory, and a stated memory (``BERT_SERVE_MEMORY``, ``stated.with_stated``): a
  limit larger than the machine (a fake 1 TiB ``memory.max``) is not memory the pod can use, and
  a stated value can only lower what there is. The reasons say which one bound it. A pod with no
  memory limit is sized for the node's memory: state its request (the Downward API's
  ``requests.memory`` in ``BERT_SERVE_MEMORY``).
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
PROC_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT_BYTES = 2**60
"""cgroup v1 writes "no limit" as a huge number (2**63 less a page); any limit this large is none."""
CGROUP_LIMIT = "the cgroup limit"
PHYSICAL = "the physical memory"
STATED = "the stated BERT_SERVE_MEMORY"


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
