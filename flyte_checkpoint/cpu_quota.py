"""The CPUs this process may use: the cores it may run on, bounded by its cgroup's CPU quota.

A container's CPU limit (Kubernetes ``resources.limits.cpu``, ``docker run --cpus``) is a cgroup
quota, not an affinity: ``os.sched_getaffinity`` still lists every core of the node. A pool sized
from it (96 threads in a pod limited to 4 CPUs) gets no more work done than 4 threads would:
the kernel throttles the whole container once the quota of each period is spent, and every
extra thread holds its buffers meanwhile. So the quota, rounded up to whole CPUs, bounds the
count, as Go's ``automaxprocs`` and the JVM's container support do.

Read from ``/proc/self/cgroup`` and the cgroup file system: ``cpu.max`` (cgroup v2) or
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1), in the process's cgroup and every cgroup
above it that is visible (the smallest limit wins). Anything missing or unreadable (not Linux,
no cgroup file system mounted) means no quota. A leaf module: it imports nothing of this package.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path


def usable_cpus(root: str = "/") -> int:
    """The cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``),
    no more than its cgroup CPU quota rounded up; at least 1. ``root`` is where ``/proc`` and
    ``/sys`` are looked for (tests give a tree of their own)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS and Windows have no affinity call
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit(root)
    return max(1, cores if limit is None else min(cores, limit))


@functools.cache
def cgroup_cpu_limit(root: str = "/") -> int | None:
    """The CPU quota of this process's cgroups in whole CPUs (rounded up), or ``None`` when no
    quota is set or none can be read. Read once per process (it costs about 0.2 ms, for every
    directory save and load otherwise): a limit changed while the process runs (an in-place pod
    resize) applies from the next process started (a forked child keeps its parent's reading)."""
    try:
        memberships = Path(root, "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            limits.extend(_limits(Path(root, "sys/fs/cgroup"), path, _v2_limit))
        elif "cpu" in controllers.split(","):
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                found = _limits(Path(root, "sys/fs/cgroup", mount), path, _v1_limit)
                if found:
                    limits.extend(found)
                    break
    return min(limits) if limits else None


def _limits(mount: Path, path: str, read: Callable[[Path], int | None]) -> list[int]:
    """The limits ``read`` finds in ``path``'s cgroup under ``mount`` and each cgroup above it.

    In a container the cgroup file system is often mounted at the container's own cgroup while
    ``/proc/self/cgroup`` names it as the host sees it; then ``path`` is not under ``mount``
    and the mount's own directory is the process's cgroup."""
    if not mount.is_dir():
        return []
    directory = mount.joinpath(path.lstrip("/"))
    if not directory.is_dir():
        directory = mount
    found = []
    while True:
        limit = read(directory)
        if limit is not None:
            found.append(limit)
        if directory == mount:
            return found
        directory = directory.parent


def _v2_limit(directory: Path) -> int | None:
    """``cpu.max`` holds ``"$MAX $PERIOD"``; ``max`` is no limit."""
    try:
        quota, period = Path(directory, "cpu.max").read_text().split()[:2]
        return None if quota == "max" else _whole_cpus(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _v1_limit(directory: Path) -> int | None:
    """``cpu.cfs_quota_us`` is ``-1`` for no limit."""
    try:
        quota = int(Path(directory, "cpu.cfs_quota_us").read_text())
        period = int(Path(directory, "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota < 0 else _whole_cpus(quota, period)


def _whole_cpus(quota: int, period: int) -> int | None:
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None
