"""Copying a file into a local temp file inside the kernel, digesting what landed, in parallel.

Reading a file into Python and writing it out again costs two copies through user memory, and
the buffered ``write`` path makes the kernel allocate page cache for data it then copies again;
``copy_file_range`` -- what ``cp`` and the reference SDK use -- moves the data inside the kernel
(or shares extents, on filesystems that can). So a worker thread copies with ``copy_file_range`` while the
caller reads back each copied range from the page cache and digests it: the digest is of the
bytes that were stored, and the two overlap on two cores.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

_STEP = 8 << 20
"""Bytes per ``copy_file_range`` call (the read-back goes in the caller's smaller chunks)."""
_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF}


def regular_file_descriptor(source: Any) -> int | None:
    """The descriptor of ``source`` if it is a file object on a regular file, else ``None``."""
    if not isinstance(source, io.BufferedReader | io.FileIO):
        return None
    try:
        descriptor = source.fileno()
        return descriptor if stat.S_ISREG(os.fstat(descriptor).st_mode) else None
    except (OSError, ValueError):
        return None


class KernelCopy:
    """Copies ``source`` from ``source_offset`` to its end into ``dest`` at ``dest_offset``.

    :meth:`start` copies the first step in the caller, so a filesystem pair without
    ``copy_file_range`` is known (:meth:`start` returns ``False``) before anything was written;
    the rest is copied by a thread. :meth:`copied` yields the growing count of bytes copied.
    """

    def __init__(
        self,
        source: int,
        source_offset: int,
        dest: int,
        dest_offset: int,
        wait_turn: Callable[[], object] | None = None,
    ) -> None:
        self._source, self._source_offset = source, source_offset
        self._dest, self._dest_offset = dest, dest_offset
        self._wait_turn = wait_turn
        self._condition = threading.Condition()
        self._count = 0
        self._done = False
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="flyte-checkpoint-copy", daemon=True)

    def start(self) -> bool:
        """Copy the first step; ``False`` if the kernel cannot copy between these two files."""
        try:
            first = self._step()
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                return False
            raise
        self._count = first
        self._done = first == 0
        if not self._done:
            self._thread.start()
        return True

    def copied(self) -> Iterator[int]:
        """Yield the number of bytes copied so far each time it grows; raise a copy failure."""
        reported = 0
        while True:
            with self._condition:
                while self._count == reported and not self._done:
                    self._condition.wait()
                count, done, error = self._count, self._done, self._error
            if error is not None:
                raise error
            if count > reported:
                reported = count
                yield count
            elif done:
                return

    def close(self) -> None:
        """Stop copying (after the step in progress) and wait for the thread."""
        with self._condition:
            self._stop = True
        if self._thread.is_alive():
            self._thread.join()

    def _step(self) -> int:
        return os.copy_file_range(
            self._source,
            self._dest,
            _STEP,
            self._source_offset + self._count,
            self._dest_offset + self._count,
        )

    def _run(self) -> None:
        try:
            while True:
                if self._wait_turn is not None:
                    self._wait_turn()
                with self._condition:
                    if self._stop:
                        return
                count = self._step()
                with self._condition:
                    self._count += count
                    self._done = count == 0
                    self._condition.notify_all()
                    if self._done:
                        return
        except BaseException as error:  # handed to the caller through copied()
            with self._condition:
                self._error = error
                self._done = True
                self._condition.notify_all()
