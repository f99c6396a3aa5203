"""Fault injection around a real store object's parallel upload (faults a server cannot be made
to produce on cue): shared by the parallel-transfer tests of every store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flyte_checkpoint.storage.parallel.bodies import PartBody


@dataclass
class Wrapped:
    """A real store object (an upload target and ranged source), seen through a test's faults."""

    real: Any

    @property
    def uri(self) -> str:
        return str(self.real.uri)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self.real.loop
        return loop


@dataclass
class FaultyTarget(Wrapped):
    """The real upload target, failing or holding the parts, completion or abort a test names."""

    fail_part: int | None = None
    error: BaseException = field(default_factory=lambda: PermissionError("injected"))
    times: int = 1_000_000
    before_part: dict[int, Callable[[], object]] = field(default_factory=dict)
    """Run ``before_part[n]()`` (a rewrite of the file being saved, say) before part ``n`` is sent."""
    fail_after_sending: bool = False
    """Fail ``fail_part`` after the real request sent its body (a reply lost on the way back)."""
    damage_put: bool = False
    """Flip a byte of a single-request upload after its digest was taken (memory gone bad)."""
    hold_part_until_done: tuple[int, int] | None = None
    fail_complete: bool = False
    fail_abort: bool = False
    slow_create_response: float = 0.0
    """Seconds the answer to starting a multipart upload takes, after the store has started it."""
    attempts: dict[int, int] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    _done: dict[int, asyncio.Event] = field(default_factory=dict)

    @property
    def max_parts(self) -> int:
        return int(self.real.max_parts)

    def _event(self, number: int) -> asyncio.Event:
        return self._done.setdefault(number, asyncio.Event())

    async def put(self, body: memoryview, metadata: Mapping[str, str]) -> None:
        if self.damage_put:
            damaged = bytearray(body)
            damaged[0] ^= 0xFF
            body = memoryview(damaged)
        await self.real.put(body, metadata)

    async def create(self, metadata: Mapping[str, str]) -> str:
        upload_id = str(await self.real.create(metadata))
        await asyncio.sleep(self.slow_create_response)
        return upload_id

    async def upload_part(self, upload_id: str, number: int, body: PartBody) -> str:
        self.attempts[number] = self.attempts.get(number, 0) + 1
        if number in self.before_part:
            self.before_part[number]()
        if self.hold_part_until_done is not None and number == self.hold_part_until_done[0]:
            await self._event(self.hold_part_until_done[1]).wait()
        failing = number == self.fail_part and self.attempts[number] <= self.times
        if failing and not self.fail_after_sending:
            raise self.error
        receipt = str(await self.real.upload_part(upload_id, number, body))
        if failing:
            raise self.error
        self.finished.append(number)
        self._event(number).set()
        return receipt

    async def complete(
        self, upload_id: str, receipts: Sequence[tuple[int, str]], metadata: Mapping[str, str]
    ) -> None:
        if self.fail_complete:
            raise self.error
        await self.real.complete(upload_id, receipts, metadata)

    async def abort(self, upload_id: str) -> None:
        if self.fail_abort:
            raise ConnectionResetError("injected: the store cannot be reached to abort")
        await self.real.abort(upload_id)

    async def sweep_stale(self, keep: str, older_than: float) -> int:
        return int(await self.real.sweep_stale(keep, older_than))

    @property
    def lost_creates(self) -> int:
        return int(self.real.lost_creates)

    async def unfinished(self) -> list[str]:
        return list(await self.real.unfinished())

    async def holds_parts(self, upload_id: str) -> bool:
        return bool(await self.real.holds_parts(upload_id))

    async def discard_unfinished(self) -> int:
        return int(await self.real.discard_unfinished())
