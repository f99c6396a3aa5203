"""The CPUs a process may use: its affinity, bounded by a container's cgroup CPU quota.

The cgroup files are written into a tree of the test's own (``root``), laid out as Linux mounts
them: a real quota cannot be set without privileges a test machine may not grant.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flyte_checkpoint.cpu_quota import cgroup_cpu_limit, usable_cpus

CORES = len(os.sched_getaffinity(0))


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_tree(root: Path, cgroup: str, **limits: str) -> Path:
    """A cgroup v2 layout: the process in ``cgroup``; ``limits`` maps a directory under the mount
    (``_`` for the mount itself) to its ``cpu.max``."""
    write(root, "proc/self/cgroup", f"0::{cgroup}\n")
    (root / "sys/fs/cgroup" / cgroup.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for directory, text in limits.items():
        write(root, f"sys/fs/cgroup/{'' if directory == '_' else directory.replace('__', '/')}/cpu.max", text)
    return root


def test_a_cgroup_v2_quota_is_rounded_up_to_whole_cpus(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(str(v2_tree(tmp_path, "/", _="150000 100000\n"))) == 2


def test_a_cgroup_v2_without_a_quota_sets_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(str(v2_tree(tmp_path, "/", _="max 100000\n"))) is None


def test_the_smallest_quota_on_the_way_up_the_cgroup_tree_wins(tmp_path: Path) -> None:
    root = v2_tree(
        tmp_path, "/kubepods/pod1/ctr", kubepods__pod1="300000 100000", kubepods__pod1__ctr="max 100000"
    )
    assert cgroup_cpu_limit(str(root)) == 3


def test_a_cgroup_v1_quota_is_read_from_the_cpu_controller(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "400000\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) == 4


def test_a_cgroup_v1_mounted_at_the_containers_own_cgroup_is_read_there(tmp_path: Path) -> None:
    # /proc/self/cgroup names the host's path, the container's mount is its own cgroup.
    write(tmp_path, "proc/self/cgroup", "3:cpu,cpuacct:/kubepods/burstable/pod1/ctr\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) == 2


def test_a_cgroup_v1_quota_of_minus_one_sets_no_limit(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "3:cpu,cpuacct:/\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) is None


@pytest.mark.parametrize("text", ["", "garbage", "100000", "0 100000", "100000 0", "max"])
def test_an_unreadable_or_malformed_quota_sets_no_limit(tmp_path: Path, text: str) -> None:
    assert cgroup_cpu_limit(str(v2_tree(tmp_path, "/", _=text))) is None


def test_no_cgroup_file_system_sets_no_limit(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "0::/\n")
    assert cgroup_cpu_limit(str(tmp_path)) is None
    assert cgroup_cpu_limit(str(tmp_path / "nothing-here")) is None


def test_the_usable_cpus_are_the_affinity_bounded_by_the_quota(tmp_path: Path) -> None:
    assert usable_cpus(str(v2_tree(tmp_path / "one", "/", _="100000 100000"))) == 1
    assert usable_cpus(str(v2_tree(tmp_path / "many", "/", _=f"{100000 * (CORES + 8)} 100000"))) == CORES
    assert usable_cpus(str(tmp_path / "none")) == CORES
