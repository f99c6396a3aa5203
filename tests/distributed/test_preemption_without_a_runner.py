"""Ranks with no runner (each torchrun worker, Flyte's Elastic tasks): the DCP manager installs the
preemption handler itself, so a SIGTERM is a notice every rank stops on after saving, never a kill.

Real gloo ranks and real signals: forked ranks that signal themselves, and a real torchrun whose
agent gets the SIGTERM, as a kubelet sends it, and forwards it to its workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
import torch

from flyte_checkpoint.distributed import DistributedCheckpointManager
from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.preemption import handler, notice
from tests.distributed import ranks
from tests.distributed.checks import load_here
from tests.faults.signals.processes import running
from tests.stores import Store

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

WORLD = 2
PG_TIMEOUT = 20  # a rank left alone in a collective fails the launch well within its timeout
LAUNCH_TIMEOUT = 60


def _run(store: Store, victims: list[int], at_step: int) -> list[dict[str, object]]:
    return ranks.run(
        "train_until_preempted",
        WORLD,
        {
            "root": store.uri("ckpt"),
            "pg_timeout": PG_TIMEOUT,
            "handler": False,
            "sigterm": [victims, at_step],
        },
        timeout=LAUNCH_TIMEOUT,
    )


@pytest.mark.parametrize("victims", [[1], [0, 1]], ids=["one rank", "every rank"])
def test_ranks_without_a_runner_stop_at_the_same_step_with_it_saved_on_a_sigterm(
    victims: list[int], local_store: Store
) -> None:
    results = _run(local_store, victims, 4)
    assert [result["saved"] for result in results] == [4] * WORLD, results
    assert all(result["committed"] is True and result["code"] == 143 for result in results), results
    state = load_here(DistributedCheckpointManager(local_store.uri("ckpt")).checkpoint_dir(4))
    assert state["extra"]["seed"] == 4


def test_torchrun_workers_save_the_same_step_and_exit_143_when_the_agent_gets_a_sigterm(
    tmp_path: Path,
) -> None:
    argv = ["--standalone", "--nproc-per-node", str(WORLD), "-m", "tests.distributed.torchrun_training"]
    environment = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        with running(
            [*argv, str(tmp_path)], module="torch.distributed.run", environment=environment
        ) as torchrun:
            torchrun.wait_for_line("ready", timeout=120)
            torchrun.send(signal.SIGTERM)
            torchrun.finish(timeout=60)
    finally:
        _reap_workers(tmp_path)
    reports = [tmp_path / f"rank-{rank}.json" for rank in range(WORLD)]
    assert all(report.exists() for report in reports), torchrun.output()
    seen = [json.loads(report.read_text()) for report in reports]
    step = seen[0]["step"]
    assert seen == [{"step": step, "saved": True, "code": 143}] * WORLD, torchrun.output()
    manager = DistributedCheckpointManager(tmp_path / "ckpt")
    assert manager.steps() == [step]
    restored = {"weights": torch.zeros(8)}
    assert manager.load(restored) is not None
    assert torch.equal(restored["weights"], torch.full((8,), float(step)))


def _reap_workers(out: Path) -> None:
    """torchrun starts each worker in its own session: a test that failed kills them here."""
    for pid_file in out.glob("pid-*"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_the_first_vote_installs_the_handler_and_close_puts_the_previous_one_back(tmp_path: Path) -> None:
    assert not handler.is_installed()
    before = signal.getsignal(signal.SIGTERM)
    try:
        with DistributedCheckpointManager(tmp_path / "ckpt", grace_seconds=12) as manager:
            assert manager.reached_preemption(1) is False
            assert handler.is_installed()
            assert signal.getsignal(signal.SIGTERM) is not before
            os.kill(os.getpid(), signal.SIGTERM)
            assert manager.reached_preemption(2) is True
            current = notice.current_notice()
            assert current is not None
            assert (current.source, current.grace_seconds) == ("SIGTERM", 12)
    finally:
        notice.clear()
    assert not handler.is_installed()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_manager_leaves_a_handler_someone_else_installed_in_place(tmp_path: Path) -> None:
    with handler.install_preemption_handler(grace_seconds=30):
        manager = DistributedCheckpointManager(tmp_path / "ckpt")
        manager.reached_preemption(1)
        manager.close()
        assert handler.is_installed()
    assert not handler.is_installed()


def test_a_vote_outside_the_main_thread_with_no_handler_is_refused(tmp_path: Path) -> None:
    manager = DistributedCheckpointManager(tmp_path / "ckpt")
    raised: list[BaseException] = []

    def vote() -> None:
        try:
            manager.reached_preemption(1)
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=vote)
    thread.start()
    thread.join()
    assert len(raised) == 1, raised
    assert isinstance(raised[0], ConfigurationError)
    assert "install_preemption_handler() in the main thread" in str(raised[0])
    assert not handler.is_installed()
