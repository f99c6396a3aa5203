"""A real Ray cluster for the tests of components as actors: three nodes on this machine.

One cluster serves a whole test module (starting one takes seconds). Each node offers a custom
resource named after it (``node0`` is the head, ``node1`` and ``node2`` are workers), so a test
pins an actor to a node with ``resources={"node1": 0.01}``. Nodes have one CPU each and the test
actors need none, so a handful of actors fit on a small machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.storage_servers import StorageServer, create_bucket

NODES = ("node0", "node1", "node2")


@dataclass
class RayCluster:
    cluster: Cluster
    session_dir: str
    worker_nodes: dict[str, Any] = field(default_factory=dict)

    def remove_node(self, name: str) -> None:
        """Take a worker node away with every process on it, as a lost machine would."""
        self.cluster.remove_node(self.worker_nodes.pop(name))

    def restore_nodes(self) -> None:
        for name in NODES[1:]:
            if name not in self.worker_nodes:
                self.worker_nodes[name] = _add_node(self.cluster, name)
        self.cluster.wait_for_nodes()


def _add_node(cluster: Cluster, name: str) -> Any:
    return cluster.add_node(num_cpus=1, resources={name: 1}, object_store_memory=80 * 1024 * 1024)


def _processes_of(session_dir: str) -> list[int]:
    """Every live process started for the Ray session in ``session_dir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if session_dir.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """Three Ray nodes and a driver connected to them; every Ray process is gone afterwards."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {NODES[0]: 1},
            "object_store_memory": 80 * 1024 * 1024,
            "include_dashboard": False,
        },
    )
    try:
        head = cluster.head_node
        assert head is not None
        nodes = RayCluster(cluster, session_dir=head.get_session_dir_path())
        nodes.restore_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield nodes
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + 10
    while (left := _processes_of(nodes.session_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"Ray processes outlived the cluster: {left}"


@dataclass(frozen=True)
class Store:
    """Where a test keeps its checkpoints: a base URI and the options to reach it."""

    kind: str
    base: str
    storage_options: dict[str, Any] | None = None

    def uri(self, name: str) -> str:
        return f"{self.base}/{name}"


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test using it runs on local disk (which every node of this machine shares) and on S3."""
    if request.param == "local":
        return Store("local", str(tmp_path / "checkpoints"))
    server: StorageServer = request.getfixturevalue("s3_server")
    return Store("s3", f"s3://{create_bucket(server, 'ray')}/checkpoints", server.storage_options)


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    return Store("local", str(tmp_path / "checkpoints"))


@pytest.fixture
def hold_dir(tmp_path: Path) -> Path:
    """Where a held actor announces itself (``entered``) and waits to be let go (``release``)."""
    directory = tmp_path / "hold"
    directory.mkdir()
    return directory


def wait_until_entered(hold_dir: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (hold_dir / "entered").exists():
        assert time.monotonic() < deadline, "the held actor never reached its hold point"
        time.sleep(0.01)
