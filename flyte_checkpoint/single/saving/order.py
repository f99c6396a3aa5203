"""The saves of one helper commit in call order: an older one never lands on a newer one."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flyte_checkpoint.storage.base import WriteGate


class SupersededError(Exception):
    """An older save found that a newer save of the same helper committed first.

    It is discarded, not failed: the checkpoint already holds a newer state. Never reaches a user.
    """


class CommitOrder:
    """Hands each save a ticket in call order and lets a save commit only if no newer one has.

    Before a notice, saves of a helper run one after the other, and the order is kept by that
    alone. After a preemption notice, the final save does not wait for the background save in
    flight (waiting cost up to a whole save of the little time left): it pauses that upload and
    goes first. The order then keeps the older upload from committing over the final one, and
    :class:`OrderedGate` ends it at its next write once the final one has committed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        """Held across a store's commit step, and only there (see :meth:`turn`)."""
        self._tickets = itertools.count(1)
        self._committed = 0

    def ticket(self) -> int:
        """The next save's place in the order.

        Never waits for :meth:`turn`'s lock: a save asks for its ticket while another may be
        committing (``next`` on a count is atomic under the GIL).
        """
        return next(self._tickets)

    def superseded(self, ticket: int) -> bool:
        """Whether a save asked for after ``ticket`` has committed."""
        return self._committed > ticket

    def check(self, ticket: int, uri: str) -> None:
        """Raise :class:`SupersededError` if a newer save than ``ticket`` committed."""
        if self.superseded(ticket):
            raise SupersededError(f"a newer save to {uri} committed first, so this older one is discarded")

    @contextmanager
    def turn(self, ticket: int, uri: str) -> Iterator[None]:
        """Hold the commit of save ``ticket``: refused if a newer one committed, recorded if it commits.

        The lock is held across the store's atomic commit step, so a check and the commit it
        allows can never be split by another save's commit. That step never waits on a pause
        gate (:meth:`~flyte_checkpoint.storage.base.ObjectWriter.commit`), so no save holding
        the lock can wait for one that is waiting for it.
        """
        with self._lock:
            self.check(ticket, uri)
            yield
            self._committed = max(self._committed, ticket)


class OrderedGate:
    """A background upload's pause gate that also ends the upload once a newer save committed."""

    def __init__(self, pause: WriteGate, order: CommitOrder, ticket: int, uri: str) -> None:
        self._pause = pause
        self._order = order
        self._ticket = ticket
        self._uri = uri

    def wait(self, timeout: float | None = None) -> bool:
        """Wait while paused, then raise :class:`SupersededError` if a newer save committed meanwhile."""
        opened = self._pause.wait(timeout)
        self._order.check(self._ticket, self._uri)
        return opened

    def is_set(self) -> bool:
        """Whether the upload may write: not paused, or already superseded (its next wait ends it)."""
        return self._pause.is_set() or self._order.superseded(self._ticket)
