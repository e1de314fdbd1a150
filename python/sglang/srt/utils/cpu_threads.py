"""CPU threads of a scheduler process: how many, on which cores, and how idle threads wait.

Chosen once at startup from what the process may really use, not from `os.cpu_count()`:
- cores: the affinity mask (`taskset`, `docker --cpuset-cpus`), capped by the cgroup CPU quota (`docker --cpus`,
  Kubernetes limits; cgroup v2 `cpu.max` or v1 `cpu.cfs_quota_us`), rounded up;
- the processes the server itself runs: with more than two cores, one is left to the HTTP/tokenizer process, which
  detokenises and streams every token; the rest is shared evenly by the scheduler processes of the node (TP ranks,
  data-parallel replicas). On two cores or fewer the forward keeps them all (it is the larger share of the work);
- `--num-threads N` overrides the count; `SGLANG_CPU_OMP_THREADS_BIND` (upstream's variable: one core list per TP
  rank, ranks separated by "|", e.g. "0-3|4-7") pins a rank's threads to its cores. Without it nothing is pinned:
  a pinned thread cannot move away from a core that a neighbour process is using.

How threads wait matters as much as their number when the cores are shared. The project's kernels
(sgl-kernel/csrc/cpu/parallel.h) split work dynamically and never wait for a thread that is not running; their idle
threads poll for KERNEL_SPIN_US (SGLANG_CPU_KERNEL_SPIN_US), yielding the core to any thread that wants it, then sleep. torch's own operators use OpenMP, whose default is to spin on a barrier
for a thread that another process has descheduled: `OMP_WAIT_POLICY=PASSIVE` (set for the scheduler processes the
server starts, unless the environment already sets it) makes those waits sleep instead. Measured on 2 cores with one
busy neighbour process (benchmark/README.md): streaming chat at c=32 went from 10 to ~410 tok/s.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

OMP_WAIT_ENV = "OMP_WAIT_POLICY"
DEFAULT_OMP_WAIT_POLICY = "PASSIVE"
BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
SPIN_ENV = "SGLANG_CPU_KERNEL_SPIN_US"
KERNEL_SPIN_US = 2000  # an idle kernel thread polls (yielding its core) this long before it sleeps (parallel.h)
CORES_KEPT_FOR_HTTP_ABOVE = 2  # with more cores than this, one is left to the HTTP/tokenizer process


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
                     ) -> Optional[float]:
    """CPUs the cgroup quota allows (quota / period), or None without a quota."""
    v1_path, v2_path = "/", "/"
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2_path = path
            elif "cpu" in controllers.split(","):
                v1_path = path
    except (OSError, ValueError):
        pass
    candidates = [(root / v2_path.lstrip("/") / "cpu.max", None), (root / "cpu.max", None)]
    for v1_dir in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for base in (root / v1_dir / v1_path.lstrip("/"), root / v1_dir):
            candidates.append((base / "cpu.cfs_quota_us", base / "cpu.cfs_period_us"))
    for quota_file, period_file in candidates:
        try:
            if period_file is None:  # v2: "max 100000" or "200000 100000"
                quota, period = quota_file.read_text().split()[:2]
                return None if quota == "max" else int(quota) / int(period)
            quota_us = int(quota_file.read_text())
            return None if quota_us <= 0 else quota_us / int(period_file.read_text())
        except (OSError, ValueError):
            continue
    return None


def available_cpus() -> Tuple[int, str]:
    """(cores this process may use, where that number comes from)."""
    try:
        cores, source = len(os.sched_getaffinity(0)), "affinity mask"
    except AttributeError:  # not Linux
        cores, source = os.cpu_count() or 1, "os.cpu_count()"
    limit = cgroup_cpu_limit()
    if limit is not None and math.ceil(limit) < cores:
        cores, source = max(1, math.ceil(limit)), f"cgroup CPU quota ({limit:g} CPUs)"
    return cores, source


def parse_core_list(text: str) -> List[int]:
    """"0-3,8" -> [0, 1, 2, 3, 8]. ValueError naming the bad part."""
    cores: List[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{BIND_ENV}: {part!r} is not a core number or range like 0-3")
        cores.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return cores


def default_threads_per_process(sharers: int = 1) -> int:
    """Threads for each of `sharers` scheduler processes of this node when --num-threads is unset."""
    cores, _ = available_cpus()
    usable = cores - 1 if cores > CORES_KEPT_FOR_HTTP_ABOVE else cores
    return max(1, usable // max(1, sharers))


def replica_num_threads(num_threads: Optional[int], dp_size: int) -> Optional[int]:
    """--num-threads of one data-parallel replica on CPU: as given, else (dp_size > 1) its share of the cores."""
    if dp_size == 1 or num_threads is not None:
        return num_threads
    return default_threads_per_process(dp_size)


@dataclass(frozen=True)
class CpuThreadPlan:
    num_threads: int
    available_cpus: int
    available_source: str
    chosen_by: str  # "--num-threads", BIND_ENV or "default"
    bound_cores: Optional[List[int]]  # None: not pinned
    omp_wait_policy: str
    kernel_spin_us: int

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        where = f"pinned to cores {self.bound_cores}" if self.bound_cores else "not pinned"
        return (f"{self.num_threads} threads ({self.chosen_by}; {self.available_cpus} cores available by the "
                f"{self.available_source}), {where}, OpenMP wait policy {self.omp_wait_policy}, kernel threads spin "
                f"{self.kernel_spin_us} us before sleeping")


def plan_cpu_threads(num_threads: Optional[int], sharers: int, local_rank: int,
                     bind: Optional[str] = None) -> CpuThreadPlan:
    """The thread plan of one scheduler process (`local_rank` of `sharers` on this node)."""
    cores, source = available_cpus()
    bind = os.environ.get(BIND_ENV) if bind is None else bind
    bound: Optional[List[int]] = None
    chosen_by = "default"
    if bind:
        lists = [p for p in bind.split("|")]
        if len(lists) < sharers:
            raise ValueError(f"{BIND_ENV}={bind!r} names {len(lists)} core lists for {sharers} processes on this "
                             "node: give one list per TP rank, separated by '|'")
        bound = parse_core_list(lists[local_rank])
        chosen_by = BIND_ENV
    if num_threads is not None:
        count, chosen_by = num_threads, "--num-threads"
    elif bound is not None:
        count = len(bound)
    else:
        count = default_threads_per_process(sharers)
    return CpuThreadPlan(num_threads=max(1, count), available_cpus=cores, available_source=source,
                         chosen_by=chosen_by, bound_cores=bound,
                         omp_wait_policy=os.environ.get(OMP_WAIT_ENV, "(OpenMP default: spin)"),
                         kernel_spin_us=int(os.environ.get(SPIN_ENV, KERNEL_SPIN_US)))


def apply_cpu_threads(plan: CpuThreadPlan) -> None:
    """Pin the process (when planned) and size torch's and the kernels' thread pools."""
    import torch

    if plan.bound_cores is not None:  # every thread of the process; threads created later inherit it
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), plan.bound_cores)
            except ProcessLookupError:  # it ended meanwhile
                pass
    torch.set_num_threads(plan.num_threads)
    from sglang.jit_kernel.cpu_ops import set_kernel_threads

    set_kernel_threads(plan.num_threads, plan.kernel_spin_us)
    logger.info("CPU threads: %s", plan.describe())


def scheduler_child_env() -> Dict[str, str]:
    """Environment added to each scheduler process the server starts (read by OpenMP when torch loads)."""
    return {} if OMP_WAIT_ENV in os.environ else {OMP_WAIT_ENV: DEFAULT_OMP_WAIT_POLICY}
