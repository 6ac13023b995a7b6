"""How many CPUs this process may really use: its affinity mask, capped by its cgroup's CPU quota.
The one count Runtime (its default threads and token budget), serve and Ray batch size by; a
leaf module (os and pathlib only), so the Triton writer and the CLI use it without onnxruntime.

os.cpu_count() is the host's count. In a container limited to 2 CPUs on a 64-core host it
says 64, and 64 onnxruntime threads time-share 2 CPUs' worth of quota: every thread is
throttled in turn and latency explodes. The quota is what the scheduler grants:
cgroup v2's ``cpu.max`` ("QUOTA PERIOD", or "max"), v1's ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us`` (-1 = none), in the process's cgroup or any cgroup above it; the
tightest applies, rounded up to whole CPUs.
"""
from __future__ import annotations

import math
import os
from pathlib import Path



def _affinity_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may run on
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(root: Path, relative: str) -> list[Path]:
    """root/relative and each folder above it up to root, deepest first (only those that exist)."""
    parts = [p for p in relative.split("/") if p]
    folders = [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [f for f in folders if f.is_dir()]


def _v2_quota(root: Path, relative: str) -> float | None:
    quotas = []
    for folder in _ancestors(root, relative):
        fields = (_read(folder / "cpu.max") or "").split()
        if len(fields) == 2 and fields[0] != "max":
            try:
                quota, period = int(fields[0]), int(fields[1])
            except ValueError:
                continue
            if quota > 0 and period > 0:
                quotas.append(quota / period)
    return min(quotas) if quotas else None


def _v1_quota(root: Path, relative: str) -> float | None:
    quotas = []
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for folder in _ancestors(root / mount, relative):
            try:
                quota = int(_read(folder / "cpu.cfs_quota_us") or "-1")
                period = int(_read(folder / "cpu.cfs_period_us") or "0")
            except ValueError:
                continue
            if quota > 0 and period > 0:
                quotas.append(quota / period)
    return min(quotas) if quotas else None


def cgroup_cpu_quota(root: str | os.PathLike = "/sys/fs/cgroup",
                     proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time the process's cgroup may use per period (e.g. 1.5), or None when
    no quota applies or none can be read (not Linux, cgroups not mounted)."""
    root, lines = Path(root), (_read(Path(proc_cgroup)) or "").splitlines()
    quotas = []
    for line in lines:  # "ID:CONTROLLERS:PATH"; v2's unified line is "0::PATH"
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, relative = fields
        if controllers == "":
            quotas.append(_v2_quota(root, relative))
        elif "cpu" in controllers.split(","):
            quotas.append(_v1_quota(root, relative))
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def available_cpus(root: str | os.PathLike = "/sys/fs/cgroup",
                   proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> int:
    """min(the cores in this process's affinity mask, its cgroup CPU quota rounded up), at least 1."""
    cores = _affinity_cores()
    quota = cgroup_cpu_quota(root, proc_cgroup)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)
