"""Safe extraction: PEP 706 ``data`` filter rules, applied by our own code on every Python."""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from pathlib import Path
from typing import IO, cast

from flyte_checkpoint.archive.compression import CHUNK, compression_threads, tar_stream
from flyte_checkpoint.archive.file_writes import FileWrites
from flyte_checkpoint.archive.lanes import Lanes
from flyte_checkpoint.archive.limits import CountingReader, ExtractionLimits, LimitCounter
from flyte_checkpoint.archive.links import link_resolution_problem, link_target_problem
from flyte_checkpoint.archive.tar_headers import FILE_TYPES, Entry, TarReader
from flyte_checkpoint.errors import ArchiveLimitError, CheckpointCorruptError, UnsafeArchiveError

THREAD_PREFIX = "flyte-checkpoint-load"
"""The name prefix of a load's threads, which inflate members and write files."""


def unpack_archive(
    source: IO[bytes],
    dest: Path,
    *,
    compressed: bool = True,
    limits: ExtractionLimits | None = None,
    threads: int | None = None,
) -> None:
    """Extract the tar stream ``source`` (gzipped when ``compressed``) into the directory ``dest``.

    Reads ``source`` to its very end, so the gzip CRC and length are checked after the last
    member. Raises :class:`CheckpointCorruptError` for a damaged stream (including one that ends
    before its end-of-archive block), :class:`UnsafeArchiveError` for a member that would leave
    ``dest`` or may not be restored, and :class:`ArchiveLimitError` past ``limits``; on error,
    what was extracted so far stays in ``dest`` for the caller to remove. An archive this
    package wrote is inflated on ``threads`` threads (default:
    :func:`~.compression.compression_threads`), with the same checks; files are written on
    as many (:mod:`.file_writes`), whatever wrote the archive.
    """
    limits = limits or ExtractionLimits()
    threads = compression_threads(threads)
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(dest))
    counted = CountingReader(source)
    # One pool inflates members and writes files: more threads than cores would only take
    # turns, and each hand-over between them costs a wake-up. Its jobs are picked so its
    # threads write different files at once; the extracting thread's own file writes are
    # urgent there, not queued behind them.
    lanes: Lanes | None = None
    try:
        lanes = Lanes(threads, THREAD_PREFIX) if threads > 1 else None
        with (
            tar_stream(cast(IO[bytes], counted), compressed=compressed, threads=threads, pool=lanes) as plain,
            FileWrites(lanes, threads) as writes,
        ):
            _Extractor(root, limits, counted if compressed else None, writes).run(plain)
    finally:
        if lanes is not None:
            lanes.shutdown(wait=True, cancel_futures=True)


# OS errors caused by what a member is called rather than by the disk: the archive cannot be
# restored here, so they are reported as such, naming the member.
_NAME_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EILSEQ})


_NAME_MAX = 255
"""The longest file name (in bytes) Linux and macOS file systems accept."""


def _path_max(root: Path) -> int:
    """PATH_MAX for ``root``'s file system: the bytes of a path, its final NUL included."""
    try:
        return os.pathconf(root, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 4096


class _Extractor:
    """Writes the members of one tar stream below ``root``, refusing anything unsafe."""

    def __init__(
        self, root: Path, limits: ExtractionLimits, compressed: CountingReader | None, writes: FileWrites
    ) -> None:
        self.root = root
        self.writes = writes
        self.limits = limits
        self.compressed = compressed
        self.counter = LimitCounter(limits, (lambda: compressed.count) if compressed is not None else None)
        self.files: set[str] = set()
        # Applied last, deepest first: a read-only directory must not block writing its
        # children, and writing a child changes its directory's mtime.
        self.directories: list[tuple[str, int, float]] = []
        self.root_text = str(root)
        self.checked_directories: set[str] = set()
        self.path_max = _path_max(root)
        self.symlinks: list[tuple[str, str, str]] = []

    def run(self, stream: IO[bytes]) -> None:
        reader = TarReader(stream, self.counter.padding)
        while (entry := reader.next()) is not None:
            self._count(entry)
            try:
                self._extract(reader, entry)
            except OSError as exc:
                if exc.errno not in _NAME_ERRNOS:
                    raise
                raise CheckpointCorruptError(
                    f"archive member {entry.name!r} cannot be restored here: {exc.strerror}"
                ) from exc
        self.writes.finish_all()  # every file whole, and a failed write raised, before the links
        for name, target, raw in self.symlinks:
            self._make_symlink(name, target, raw)
        # Checked only now that every link exists: one link's target may run through another
        # that comes later in the archive.
        for name, target, raw in self.symlinks:
            problem = link_resolution_problem(str(self.root), name, target, "the workspace")
            if problem is not None:
                raise UnsafeArchiveError(
                    f"archive member {raw!r} is a symbolic link to {target!r}, {problem}"
                )
        for directory, mode, mtime in reversed(self.directories):
            os.chmod(directory, mode)
            os.utime(directory, (mtime, mtime), follow_symlinks=False)

    def _extract(self, reader: TarReader, entry: Entry) -> None:
        name = self._safe_name(entry.name, entry)
        if entry.sparse or entry.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeArchiveError(
                f"unsupported: sparse member {entry.name!r} (written by tar --sparse / -S); only "
                "plain files are restored, so re-create the archive without --sparse (its "
                "holes are then stored as zeros, which compress to almost nothing)"
            )
        self._check_path_length(name, entry)
        if entry.type == tarfile.DIRTYPE:
            self._make_directory(name, entry)
        elif entry.type in FILE_TYPES:
            self._write_file(reader, entry, name)
        elif entry.type == tarfile.SYMTYPE:
            self._defer_symlink(entry, name)
        elif entry.type == tarfile.LNKTYPE:
            self._make_hardlink(entry, name)
        else:
            raise UnsafeArchiveError(
                f"archive member {entry.name!r} is a {entry.describe()}; only files, "
                "directories and links are restored"
            )

    def _count(self, entry: Entry) -> None:
        self.counter.member(entry.name, entry.size if entry.type in FILE_TYPES else 0)

    def _check_path_length(self, name: str, entry: Entry) -> None:
        """Refuse, naming the limit, a member whose path this system cannot create."""
        full = len(os.fsencode(os.path.join(self.root, name)))
        longest = max(len(os.fsencode(part)) for part in name.split("/"))
        if full < self.path_max and longest <= _NAME_MAX:
            return
        shown = repr(entry.name) if len(entry.name) <= 512 else f"{entry.name[:512]!r}…"
        raise ArchiveLimitError(
            f"archive member {shown} has a path of {full} bytes in the workspace (a name of up to "
            f"{longest}), over this system's limits of {self.path_max - 1} bytes per path "
            f"(PATH_MAX) and {_NAME_MAX} per name (NAME_MAX): it cannot be restored here; save "
            "the tree with shorter paths"
        )

    def _safe_name(self, raw: str, entry: Entry, role: str = "") -> str:
        """``raw`` normalised (no ``.`` or empty parts), or refused; ``role`` names a link target."""
        subject = f"archive member {entry.name!r}" + (f" {role} {raw!r}, which" if role else "")
        if "\x00" in raw:
            raise UnsafeArchiveError(f"{subject} contains a NUL byte")
        if raw.startswith("/"):
            raise UnsafeArchiveError(f"{subject} {'is' if role else 'has'} an absolute path")
        # On POSIX a backslash or a drive letter is an ordinary character of a file name.
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafeArchiveError(f"{subject} climbs out of the workspace with '..'")
        if not parts:
            return "."
        return "/".join(parts)

    def _path(self, name: str, entry: Entry) -> str:
        """The destination of ``name``, after checking no existing parent is a link or a file."""
        if name == ".":
            return self.root_text
        parents = name.split("/")[:-1]
        for depth in range(1, len(parents) + 1):
            parent = "/".join(parents[:depth])
            self._directory(parent, entry, "would be written through {}, which is not a directory")
        return f"{self.root_text}/{name}"

    def _directory(self, name: str, entry: Entry, problem: str) -> str:
        """Make directory ``name`` unless it exists; if it is not one, refuse ``entry``, saying
        ``problem`` (formatted with ``name``)."""
        path = f"{self.root_text}/{name}"
        if name in self.checked_directories:
            return path
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            os.mkdir(path, 0o700)
        else:
            if not stat.S_ISDIR(mode):
                raise UnsafeArchiveError(f"archive member {entry.name!r} {problem.format(name)}")
        # Stays a directory: no member may replace one, and links are made only at the end.
        self.checked_directories.add(name)
        return path

    def _make_directory(self, name: str, entry: Entry) -> None:
        self._path(name, entry)
        path = self._directory(name, entry, "replaces a file by a directory")
        self.directories.append((path, (entry.mode & 0o755) | 0o700, entry.mtime))

    def _write_file(self, reader: TarReader, entry: Entry, name: str) -> None:
        path = self._path(name, entry)
        self.files.discard(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            self._replace_allowed(path, entry)
            fd = os.open(path, flags, 0o600)
        file = self.writes.start(fd, entry.size, safe_file_mode(entry.mode), entry.mtime)
        reader.route_data(self.writes.route(file))
        offset = 0
        while parts := reader.read_data(CHUNK):
            size = sum(len(part) for part in parts)
            self.writes.write(file, parts, offset)
            offset += size
            self.counter.unpacked_bytes(size, entry.name)
        self.writes.end(file)
        self.files.add(name)

    def _replace_allowed(self, path: str, entry: Entry) -> None:
        """A later member may replace an earlier file of the same name, never a directory."""
        try:
            existing = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(existing):
            raise UnsafeArchiveError(f"archive member {entry.name!r} replaces a directory")
        os.unlink(path)

    def _defer_symlink(self, entry: Entry, name: str) -> None:
        target = entry.linkname
        problem = link_target_problem(name, target, "the workspace")
        if problem is not None:
            raise UnsafeArchiveError(
                f"archive member {entry.name!r} is a symbolic link to {target!r}, {problem}"
            )
        self._path(name, entry)  # parents are created now, as real directories
        self.symlinks.append((name, target, entry.name))

    def _make_symlink(self, name: str, target: str, raw: str) -> None:
        path = f"{self.root_text}/{name}"
        if os.path.lexists(path):
            raise UnsafeArchiveError(
                f"archive member {raw!r} is a symbolic link that would replace an extracted entry"
            )
        os.symlink(target, path)

    def _make_hardlink(self, entry: Entry, name: str) -> None:
        target = self._safe_name(entry.linkname, entry, "is a hard link to")
        path = self._path(name, entry)
        if target not in self.files or target == name:
            raise UnsafeArchiveError(
                f"archive member {entry.name!r} is a hard link to {entry.linkname!r}, which is not "
                "a file extracted earlier from the same archive"
            )
        self._replace_allowed(path, entry)
        os.link(f"{self.root_text}/{target}", path, follow_symlinks=False)
        self.files.add(name)


def safe_file_mode(mode: int) -> int:
    """PEP 706 ``data`` rules: drop setuid/setgid/sticky and group/other write; owner can read+write."""
    mode = (mode & 0o755) | 0o600
    if not mode & 0o100:
        mode &= ~0o011
    return mode
