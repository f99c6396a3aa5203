"""Local disk: atomic replace through a locked temporary file beside the destination."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import stat
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import cast

from flyte_checkpoint.archive import describe_mode
from flyte_checkpoint.errors import CheckpointStorageError
from flyte_checkpoint.lockfiles import create_locked, remove_if_abandoned
from flyte_checkpoint.progress import ProgressCallback, ProgressReporter
from flyte_checkpoint.storage.base import (
    CONTENT_SIZE_KEY,
    COPY_CHUNK,
    DIGEST_KEY,
    FORMAT_KEY,
    SIZE_KEY,
    Backend,
    ObjectInfo,
    ObjectWriter,
    ReadsInto,
    VerifyingReader,
    WriteGate,
)
from flyte_checkpoint.storage.deferred_unlink import RETIRED_SUFFIX, release, retire
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.storage.kernel_copy import KernelCopy, regular_file_descriptor
from flyte_checkpoint.tree_removal import remove_tree
from flyte_checkpoint.uris import local_path

logger = logging.getLogger("flyte_checkpoint")

# Every record of an object in one extended attribute of at most 56 bytes, the space ext4 has
# inside a 256-byte inode: a larger or second attribute takes a block of its own, whose
# allocation, and release when the object is next replaced, cost a fifth of a 1 KiB save.
XATTR_NAME = "user.flyte_checkpoint"
CONTENT_XATTR_NAME = "user.flyte_checkpoint.content_size"
"""A directory archive's content size (see :func:`_set_metadata`)."""
# The file's modification time when this package wrote it. A tool that rewrites the file in place
# (the reference SDK does) keeps the extended attributes but changes the time: the record is then
# stale, and the object is treated like any object written by another tool.
STAMP_KEY = "flyte_checkpoint_mtime_ns"
RECORD_FIELDS = (FORMAT_KEY, DIGEST_KEY, SIZE_KEY, STAMP_KEY)
_TEMP_SUFFIX = ".fc-tmp"
_XATTR_UNSUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.E2BIG, errno.ENOSPC}


def _files_beside(dest: Path, suffix: str) -> list[Path]:
    """The files ``.<dest's name>.<random><suffix>`` that saves of ``dest`` create beside it."""
    prefix = f".{dest.name}."
    try:
        names = os.listdir(dest.parent)
    except FileNotFoundError:
        return []
    return [dest.parent / name for name in names if name.startswith(prefix) and name.endswith(suffix)]


def temp_files_for(dest: Path) -> list[Path]:
    """The temporary files that saves of ``dest`` create beside it (live or left by a crash)."""
    return _files_beside(dest, _TEMP_SUFFIX)


def retired_names_for(dest: Path) -> list[Path]:
    """Second names of ``dest``'s replaced objects still on disk (pending, or left by a crash)."""
    return _files_beside(dest, RETIRED_SUFFIX)


def remove_stale_temp_files(dest: Path) -> int:
    """Delete temp files of ``dest`` whose writer is gone; return how many were removed.

    A writer holds an exclusive ``flock`` on its temp file until it has renamed it, and the kernel
    drops that lock when the process dies, so a file we can lock is one nobody is writing.
    """
    return sum(remove_if_abandoned(temp, partial(os.unlink, temp)) for temp in temp_files_for(dest))


_swept: set[Path] = set()
_swept_lock = threading.Lock()


def _sweep_once(dest: Path) -> None:
    """Remove abandoned temp files of ``dest`` at this process's first save of it.

    Temp files are abandoned by processes that died mid-save, which in practice is the previous
    attempt of this task: once per process is enough, and spares every later save a listing.
    """
    with _swept_lock:
        if dest in _swept:
            return
        _swept.add(dest)
    remove_stale_temp_files(dest)
    for retired in retired_names_for(dest):  # nothing reads an object by its second name
        with contextlib.suppress(OSError):
            os.unlink(retired)


class LocalWriter(ObjectWriter):
    """Writes into ``.<name>.<random>.fc-tmp`` beside ``dest`` and renames it over ``dest``.

    Atomicity: ``os.replace`` within one directory is atomic on POSIX filesystems, so a reader
    -- and the next attempt after this process is killed at any instant -- sees the old file or
    the new one, complete. The temp file lives in the destination's own directory because a
    rename across filesystems is a copy.

    Durability against a power cut or kernel crash (not a process crash: the kernel still writes
    back a killed process's data) needs ``fsync=True``: the temp file is then fsynced before the
    rename and the directory after it, so the name can only ever point at data on the disk.
    Without it a machine crash within the kernel's writeback delay (about 30 s) can leave the new
    object torn, which the recorded size and digest then report as corrupt on load.
    """

    def __init__(
        self,
        uri: str,
        dest: Path,
        metadata: Mapping[str, str],
        *,
        fsync: bool,
        progress: ProgressReporter | None = None,
        gate: WriteGate | None = None,
    ) -> None:
        super().__init__(uri, progress=progress, gate=gate)
        self.metadata.update(metadata)
        self._dest = dest
        self._fsync = fsync
        with translated_os_errors(uri, "saving"):
            if dest.is_dir():
                raise IsADirectoryError(errno.EISDIR, "is a directory", str(dest))
            self._created_directories: list[Path] = []
            _sweep_once(dest)
            try:
                self._temp, self._fd = self._create_locked_temp()
            except FileNotFoundError:  # the first save into a new directory
                try:
                    self._created_directories = make_directories(dest.parent)
                except FileExistsError:
                    _raise_for_dangling_link(uri, dest.parent)
                    raise NotADirectoryError(errno.ENOTDIR, "a parent is a file", str(dest)) from None
                self._temp, self._fd = self._create_locked_temp()
        # Small: most writes are one payload or large blocks, which pass the buffer by.
        self._file = os.fdopen(self._fd, "wb", buffering=64 << 10, closefd=False)

    def _create_locked_temp(self) -> tuple[Path, int]:
        while True:
            temp = self._dest.parent / f".{self._dest.name}.{os.urandom(8).hex()}{_TEMP_SUFFIX}"
            fd = create_locked(temp, 0o644)
            if fd is not None:
                return temp, fd

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        with translated_os_errors(self.uri, "saving"):
            self._file.write(data)

    def write_from(self, source: ReadsInto, chunk_size: int = COPY_CHUNK) -> int:
        """Like :meth:`ObjectWriter.write_from`; a regular file is copied by the kernel.

        See :mod:`flyte_checkpoint.storage.kernel_copy`. The digest is taken from the temp
        file after the copy, so it always describes the bytes stored.
        """
        source_fd = regular_file_descriptor(source)
        if source_fd is None:
            return super().write_from(source, chunk_size)
        file_source = cast(io.BufferedReader, source)
        with translated_os_errors(self.uri, "saving"):
            self._file.flush()
            start, dest_start = file_source.tell(), self._size
            copy = KernelCopy(source_fd, start, self._fd, dest_start, self._gate.wait if self._gate else None)
            if not copy.start():
                return super().write_from(source, chunk_size)
            view = memoryview(bytearray(chunk_size))
            digested = 0
            try:
                for copied in copy.copied():
                    while digested < copied:
                        wanted = view[: min(chunk_size, copied - digested)]
                        count = os.preadv(self._fd, [wanted], dest_start + digested)
                        if count == 0:
                            raise OSError(errno.EIO, "the copy is shorter than reported", str(self._temp))
                        self._account(view[:count])
                        digested += count
            finally:
                copy.close()
            file_source.seek(start + digested)
            self._file.seek(dest_start + digested)
        return digested

    def _prepare(self) -> None:
        with translated_os_errors(self.uri, "saving"):
            self._file.flush()
            self._file.close()
            stamp = str(os.fstat(self._fd).st_mtime_ns)
            _set_metadata(self._fd, {**self.metadata, STAMP_KEY: stamp})
            if self._fsync:
                os.fsync(self._fd)

    def _commit(self) -> None:
        # The atomic step: one rename in the destination's own directory (see the class docstring).
        with translated_os_errors(self.uri, "saving"):
            retired: Path | None = None
            try:
                retired = retire(self._dest)
                # Still holding the lock, so no sweep can remove the temp file before the rename.
                os.replace(self._temp, self._dest)
            finally:
                if retired is not None:
                    release(retired)
            if self._fsync:
                _fsync_directory(self._dest.parent)
                # A directory made for this object is durable only once its own parent is synced.
                for directory in self._created_directories:
                    _fsync_directory(directory.parent)
            os.close(self._fd)

    def _abort(self) -> None:
        try:
            self._file.close()  # what it still buffers goes with the temp file
        except OSError as exc:
            logger.debug("closing the discarded temp file %s failed: %r", self._temp, exc)
        try:
            os.unlink(self._temp)
        except FileNotFoundError:
            pass
        except OSError as exc:
            # The save has failed already and that error is the one raised; a later process's
            # first save to the same destination sweeps the file (_sweep_once): say where it is.
            logger.warning(
                "could not remove %s, the temp file of a failed save to %s: %r", self._temp, self.uri, exc
            )
        try:
            os.close(self._fd)
        except OSError as exc:
            logger.debug("closing the descriptor of %s failed: %r", self._temp, exc)


def _open_object(path: Path) -> int | None:
    """A read descriptor of ``path``, or ``None`` when nothing is there.

    Non-blocking, so that a FIFO given as a checkpoint is reported as one rather than waiting for
    a writer forever; the flag does nothing to a regular file's reads.
    """
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None


def _raise_for_dangling_link(uri: str, directory: Path) -> None:
    """Name the symbolic link to nothing among ``directory`` and its parents, if there is one:
    ``mkdir`` then fails as if a file were in the way."""
    for candidate in (directory, *directory.parents):
        if candidate.is_symlink() and not candidate.exists():
            raise CheckpointStorageError(
                f"cannot save {uri}: its parent {candidate} is a symbolic link to "
                f"{os.readlink(candidate)!r}, which does not exist; create that directory or fix the link"
            )


def make_directories(directory: Path) -> list[Path]:
    """``mkdir -p directory``; return the directories that were created, outermost first."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    directory.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_record(metadata: Mapping[str, str]) -> bytes:
    """``metadata`` as the attribute's value: its fields in a fixed order, space-separated."""
    unknown = set(metadata) - set(RECORD_FIELDS)
    if unknown:
        raise ValueError(f"local objects cannot record {sorted(unknown)}")
    return " ".join(metadata.get(key, "-") for key in RECORD_FIELDS).encode()


def decode_record(value: bytes) -> dict[str, str]:
    """The metadata in an attribute value; empty when it is not one (the object is then unverified)."""
    fields = value.decode(errors="replace").split(" ")
    if len(fields) != len(RECORD_FIELDS):
        return {}
    return {key: field for key, field in zip(RECORD_FIELDS, fields, strict=True) if field != "-"}


def _set_metadata(fd: int, metadata: Mapping[str, str]) -> None:
    """Record metadata as an extended attribute; silently skipped where the filesystem has none.

    A directory archive's content size goes in an attribute of its own: the record is kept to
    the 56 bytes an ext4 inode holds inline, which every save's record fits.
    """
    record = {key: value for key, value in metadata.items() if key != CONTENT_SIZE_KEY}
    try:
        os.setxattr(fd, XATTR_NAME, encode_record(record))
        if CONTENT_SIZE_KEY in metadata:
            os.setxattr(fd, CONTENT_XATTR_NAME, metadata[CONTENT_SIZE_KEY].encode())
    except OSError as exc:
        if exc.errno not in _XATTR_UNSUPPORTED:
            raise


def _get_metadata(fd: int) -> dict[str, str]:
    try:
        record = decode_record(os.getxattr(fd, XATTR_NAME))
    except OSError:
        return {}
    if record.get(FORMAT_KEY) == "archive":
        with contextlib.suppress(OSError):
            record[CONTENT_SIZE_KEY] = os.getxattr(fd, CONTENT_XATTR_NAME).decode(errors="replace")
    return record


class LocalBackend(Backend):
    """Plain paths and ``file://`` URIs, without fsspec (whose local writes are not atomic).

    ``fsync``: make every write durable against power loss, not only atomic (see
    :class:`LocalWriter`); it costs two ``fsync`` calls per object.
    """

    def __init__(self, *, fsync: bool = False) -> None:
        self.fsync = fsync

    def open_write(
        self,
        uri: str,
        metadata: Mapping[str, str],
        *,
        declared_digest: str | None = None,
        declared_size: int | None = None,
        progress: ProgressReporter | None = None,
        gate: WriteGate | None = None,
    ) -> ObjectWriter:
        writer = LocalWriter(uri, local_path(uri), metadata, fsync=self.fsync, progress=progress, gate=gate)
        writer.declare(declared_digest, declared_size)
        return writer

    def open_read(self, uri: str, *, progress: ProgressCallback | None = None) -> VerifyingReader | None:
        path = local_path(uri)
        with translated_os_errors(uri, "loading"):
            fd = _open_object(path)
            if fd is None:
                return None
            try:
                # Size and metadata come from the open descriptor, so a concurrent replace of the
                # path cannot pair one object's bytes with another's digest.
                info = self._describe(uri, fd, "loading")
                os.set_blocking(fd, True)  # a regular file: reads as any other file's
            except BaseException:
                os.close(fd)
                raise
            stream = open(fd, "rb", buffering=0)  # noqa: SIM115 - owned by the reader
        return VerifyingReader(stream, info, progress=progress)

    def info(self, uri: str) -> ObjectInfo | None:
        path = local_path(uri)
        with translated_os_errors(uri, "inspecting"):
            fd = _open_object(path)
            if fd is None:
                return None
            try:
                return self._describe(uri, fd, "inspecting")
            finally:
                os.close(fd)

    @staticmethod
    def _describe(uri: str, fd: int, action: str) -> ObjectInfo:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise CheckpointStorageError(
                f"cannot use {uri} ({action}): it is a {describe_mode(status.st_mode)}, not a "
                "checkpoint file; a checkpoint location names a single file, e.g. .../checkpoint"
            )
        metadata = _get_metadata(fd)
        stamp = metadata.pop(STAMP_KEY, None)
        if stamp is not None and stamp != str(status.st_mtime_ns):
            metadata = {}  # rewritten by another tool since we wrote it: the record is stale
        return ObjectInfo(
            uri=uri,
            size=status.st_size,
            metadata=metadata,
            modified=datetime.fromtimestamp(status.st_mtime, tz=timezone.utc),
        )

    def delete(self, uri: str) -> None:
        with translated_os_errors(uri, "deleting"):
            local_path(uri).unlink(missing_ok=True)

    def list_prefix(self, uri: str) -> list[str]:
        root = local_path(uri)
        with translated_os_errors(uri, "listing"):
            if not root.is_dir():
                return []
            found = [
                str(path)
                for path in root.rglob("*")
                if path.is_file() and not path.name.endswith((_TEMP_SUFFIX, RETIRED_SUFFIX))
            ]
        return sorted(found)

    def list_children(self, uri: str) -> list[str]:
        root = local_path(uri)
        with translated_os_errors(uri, "listing"):
            try:
                entries = list(os.scandir(root))
            except (FileNotFoundError, NotADirectoryError):
                return []
            return sorted(
                entry.name
                for entry in entries
                if entry.is_dir(follow_symlinks=False)
                or (entry.is_file() and not entry.name.endswith((_TEMP_SUFFIX, RETIRED_SUFFIX)))
            )

    def delete_prefix(self, uri: str) -> None:
        root = local_path(uri)
        with translated_os_errors(uri, "deleting"):
            if root.is_dir():
                remove_tree(str(root))
