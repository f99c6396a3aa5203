"""Acknowledgements through storage: for ranks that have no other channel to the coordinator.

A rank started as a plain process stores its part, then leaves an :class:`AckRecord` under the
version's ``acks/`` (or the cause, when it failed). The coordinator's ``commit`` polls that
prefix (bounded) and watches the rank processes it was given, then hands the gathered
:class:`PartAck` list to the one commit step, :func:`~flyte_checkpoint.state.commit.commit_acks`.
Callers with their own channel (a torch.distributed process group, Ray actors) skip this module:
they gather the acks themselves and call ``commit_version``.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from multiprocessing.process import BaseProcess
from typing import Any, TypeAlias

from flyte_checkpoint.errors import (
    CheckpointUnavailableError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
)
from flyte_checkpoint.state.components import describe_exception
from flyte_checkpoint.state.failures import part_failed, timed_out
from flyte_checkpoint.state.layout import Layout, ack_name
from flyte_checkpoint.state.manifest import AckRecord, PartAck, from_json, to_json
from flyte_checkpoint.state.objects import read_record, write_record
from flyte_checkpoint.timebounds import Deadline

logger = logging.getLogger("flyte_checkpoint")

Worker: TypeAlias = BaseProcess | subprocess.Popen[Any] | int
"""A process writing a part: a ``multiprocessing.Process``, a ``subprocess.Popen``, or a pid."""

_MAX_POLL_INTERVAL = 0.1
_ACK_NAME = re.compile(r"^part-(\d+)\.json$")


# --------------------------------------------------------------------------- the rank's side


def record_ack(layout: Layout, version_id: str, ack: PartAck) -> None:
    """Leave ``ack`` where the coordinator's ``commit`` looks for it."""
    record = AckRecord(position=ack.position, ok=True, part=ack, pid=os.getpid(), host=socket.gethostname())
    write_record(layout.backend, layout.ack_uri(version_id, ack.position), to_json(record))


def record_failure(layout: Layout, version_id: str, position: int, exc: BaseException) -> None:
    """Leave the cause where the coordinator looks, so it fails at once instead of timing out.

    Best-effort: the rank re-raises its own error whatever happens here.
    """
    try:
        record = AckRecord(
            position=position,
            ok=False,
            error=describe_exception(exc),
            pid=os.getpid(),
            host=socket.gethostname(),
        )
        write_record(layout.backend, layout.ack_uri(version_id, position), to_json(record))
    except Exception as failure:
        logger.warning("could not record the failure of part %d for the coordinator: %s", position, failure)


# --------------------------------------------------------------------------- the coordinator's side


def workers_by_position(
    workers: Mapping[int, Worker] | Sequence[Worker] | None, world_size: int
) -> dict[int, Worker]:
    """``workers`` as ``{position: process}``, checked against ``world_size``."""
    if workers is None:
        return {}
    if isinstance(workers, Mapping):
        by_position = dict(workers)
    elif isinstance(workers, Sequence) and not isinstance(workers, str | bytes):
        if len(workers) != world_size:
            raise InvalidCheckpointInputError(
                f"workers lists {len(workers)} processes for {world_size} parts; give one per "
                "position, or a {position: process} mapping"
            )
        by_position = dict(enumerate(workers))
    else:
        raise UnsupportedTypeError(f"workers must be a mapping or a sequence, not {type(workers).__name__}")
    for position, worker in by_position.items():
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < world_size:
            raise InvalidCheckpointInputError(
                f"workers names position {position!r}, outside 0..{world_size - 1}"
            )
        if not isinstance(worker, BaseProcess | subprocess.Popen) and (
            isinstance(worker, bool) or not isinstance(worker, int)
        ):
            raise UnsupportedTypeError(
                f"the worker of part {position} is a {type(worker).__name__}; give a "
                "multiprocessing.Process, a subprocess.Popen or a pid"
            )
    return by_position


def exit_status(worker: Worker) -> str | None:
    """How ``worker`` ended ("... exited with code 1", "... killed by SIGKILL"); ``None`` while it runs."""
    if isinstance(worker, BaseProcess):
        code = worker.exitcode
        pid = worker.pid
    elif isinstance(worker, subprocess.Popen):
        code = worker.poll()
        pid = worker.pid
    else:
        pid = worker
        if _pid_alive(pid):
            return None
        return f"its writer process {pid} is gone"
    if code is None:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"its writer process {pid} was killed by {name}"
    return f"its writer process {pid} exited with code {code}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A dead child that nobody has reaped yet still answers signal 0; Linux shows it as a zombie.
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0] != b"Z"
    except (OSError, IndexError):
        return True


def await_acks(
    layout: Layout,
    version_id: str,
    world_size: int,
    workers: Mapping[int, Worker],
    deadline: Deadline,
    poll_interval: float,
    consequence: str,
) -> list[PartAck]:
    """Poll the version's ``acks/`` until every position has acknowledged; bounded by ``deadline``.

    One listing per round finds new acknowledgements, so the cost of a round does not grow with
    the number of parts still missing. A worker's exit is checked *before* the listing, so an
    acknowledgement written just before it exited is never mistaken for a missing one.
    """
    acks: dict[int, PartAck] = {}
    expected = {ack_name(position): position for position in range(world_size)}
    interval = max(0.001, poll_interval)
    acks_uri = layout.acks_uri(version_id)
    while len(acks) < world_size:
        exited = {
            position: status
            for position, worker in workers.items()
            if position not in acks and (status := exit_status(worker)) is not None
        }
        try:
            listed = layout.backend.list_children(acks_uri)
        except CheckpointUnavailableError as exc:
            # A transient listing failure is not a verdict: keep polling until the deadline.
            logger.debug("listing %s failed (%s); polling again", acks_uri, exc)
            listed = []
        for name in listed:
            position = expected.get(name)
            if position is None:
                _refuse_stray_ack(name, world_size, consequence)
                continue
            if position not in acks:
                acks[position] = _accept_ack(layout, version_id, position, consequence)
        for position, status in sorted(exited.items()):
            if position not in acks:
                raise part_failed(position, f"{status} before acknowledging its part", consequence)
        if len(acks) == world_size:
            break
        if deadline.expired:
            missing = [position for position in range(world_size) if position not in acks]
            raise timed_out(
                f"timed out after {deadline.seconds:g} s waiting for {_describe_positions(missing)} "
                f"of {world_size} under {layout.version_uri(version_id)}; {consequence}"
            )
        time.sleep(min(interval, deadline.remaining()))
        interval = min(interval * 1.5, _MAX_POLL_INTERVAL)
    return [acks[position] for position in range(world_size)]


def _refuse_stray_ack(name: str, world_size: int, consequence: str) -> None:
    """A writer that thinks the world is larger than the coordinator does is a misconfiguration
    that waiting cannot fix: say so at once."""
    match = _ACK_NAME.match(name)
    if match is not None and int(match.group(1)) >= world_size:
        raise part_failed(
            int(match.group(1)),
            f"a writer acknowledged it, but the coordinator expects only {world_size} parts "
            f"(positions 0..{world_size - 1}); check RANK and WORLD_SIZE",
            consequence,
        )


def _describe_positions(positions: list[int]) -> str:
    shown = ", ".join(str(position) for position in positions[:20])
    more = f" and {len(positions) - 20} more" if len(positions) > 20 else ""
    return f"part{'s' if len(positions) > 1 else ''} {shown}{more}"


def _accept_ack(layout: Layout, version_id: str, position: int, consequence: str) -> PartAck:
    uri = layout.ack_uri(version_id, position)
    data = read_record(layout.backend, uri)
    if data is None:
        raise part_failed(position, f"its acknowledgement {uri} vanished", consequence)
    record = from_json(AckRecord, data, uri)
    if record.position != position:
        raise part_failed(position, f"{uri} acknowledges part {record.position} instead", consequence)
    if not record.ok:
        raise part_failed(
            position, f"its writer (pid {record.pid} on {record.host}) raised {record.error}", consequence
        )
    assert record.part is not None
    return record.part
