"""Restoring an incremental checkpoint: read the manifest, fetch and check its chunks, write files.

The manifest is not trusted more than an archive is: the same rules apply (PEP 706's ``data``
filter, as :mod:`flyte_checkpoint.archive` applies them): no absolute path, no ``..``, no entry
twice, no file written through a link (links are made last, then each is followed to check it
stays inside the tree), permission bits without setuid/setgid/sticky or group/other write; and
the extraction limits on entries and bytes. Each file is written under its own name (created,
never opened through a link or over an existing entry); a restore that fails leaves the
workspace to the caller to reset, as an archive's extraction does.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import IO

from flyte_checkpoint.archive import ExtractionLimits, safe_file_mode
from flyte_checkpoint.archive.links import link_resolution_problem, link_target_problem
from flyte_checkpoint.errors import ArchiveLimitError, UnsafeArchiveError
from flyte_checkpoint.incremental.chunks import DEFAULT_WORKERS, ChunkStore, parallel
from flyte_checkpoint.incremental.layout import resolve_store
from flyte_checkpoint.incremental.manifest import FileEntry, Manifest, read_manifest
from flyte_checkpoint.storage import COPY_CHUNK, Backend
from flyte_checkpoint.storage.errors import translated_os_errors

_WHERE = "the workspace"
_ZEROS = bytes(COPY_CHUNK)
_ZEROS_UP_TO = 64 << 20


def restore_directory(
    backend: Backend,
    uri: str,
    stream: IO[bytes],
    dest: Path,
    limits: ExtractionLimits,
    *,
    workers: int = DEFAULT_WORKERS,
) -> Path:
    """Restore the incremental checkpoint whose manifest (at ``uri``) ``stream`` reads into the
    empty ``dest``.

    Raises :class:`CheckpointChunkError` for a chunk that is missing or damaged,
    :class:`UnsafeArchiveError` for a manifest that breaks the rules above,
    :class:`ArchiveLimitError` past ``limits``.
    """
    manifest = read_manifest(stream, uri, limits.max_manifest_bytes)
    _check_limits(manifest, limits, uri)
    store = ChunkStore(
        resolve_store(uri, manifest.chunk_store), chunk_size=manifest.chunk_size, workers=workers
    )
    root = str(dest)
    seen: set[str] = set()
    with translated_os_errors(root, f"restoring {uri} into"):
        for directory in sorted(manifest.directories, key=lambda entry: entry.path.count("/")):
            path = _place(root, _checked(directory.path, seen, uri))
            os.mkdir(path, 0o700)
        for entry in manifest.files:
            _place(root, _checked(entry.path, seen, uri))
        parallel(lambda entry: _write_file(backend, store, root, entry), manifest.files, workers)
        for link in manifest.symlinks:
            name = _checked(link.path, seen, uri)
            problem = link_target_problem(name, link.target, _WHERE)
            if problem is not None:
                raise UnsafeArchiveError(
                    f"{uri} lists {name!r}, a symbolic link to {link.target!r}, {problem}"
                )
            os.symlink(link.target, _place(root, name))
        for link in manifest.symlinks:
            problem = link_resolution_problem(root, link.path, link.target, _WHERE)
            if problem is not None:
                raise UnsafeArchiveError(
                    f"{uri} lists {link.path!r}, a symbolic link to {link.target!r}, {problem}"
                )
        for directory in manifest.directories:
            os.chmod(f"{root}/{directory.path}", (directory.mode & 0o755) | 0o700)
    return dest


def _check_limits(manifest: Manifest, limits: ExtractionLimits, uri: str) -> None:
    entries = len(manifest.directories) + len(manifest.files) + len(manifest.symlinks)
    if entries > limits.max_members:
        raise ArchiveLimitError(
            f"incremental checkpoint {uri} lists {entries} entries, over the limit of {limits.max_members}"
        )
    if manifest.content_size > limits.max_total_bytes:
        raise ArchiveLimitError(
            f"incremental checkpoint {uri} holds {manifest.content_size} bytes, over the limit of "
            f"{limits.max_total_bytes}"
        )


def _checked(name: str, seen: set[str], uri: str) -> str:
    """``name`` if it is a plain relative path not listed before, else :class:`UnsafeArchiveError`."""
    parts = name.split("/")
    if "\x00" in name or name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise UnsafeArchiveError(
            f"incremental checkpoint {uri} lists {name!r}, which is not a plain relative path "
            "inside the workspace (absolute, '..', '.', empty part or NUL byte)"
        )
    if name in seen:
        raise UnsafeArchiveError(f"incremental checkpoint {uri} lists {name!r} twice")
    seen.add(name)
    return name


def _place(root: str, name: str) -> str:
    """Where ``name`` goes: every parent must already be a directory this restore made."""
    parent = f"{root}/{name.rpartition('/')[0]}"
    if "/" in name and (os.path.islink(parent) or not os.path.isdir(parent)):
        raise UnsafeArchiveError(f"{name!r} does not lie in a directory the checkpoint lists")
    return f"{root}/{name}"


def _write_file(backend: Backend, store: ChunkStore, root: str, entry: FileEntry) -> None:
    if sum(chunk.size for chunk in entry.chunks) != entry.size:
        raise UnsafeArchiveError(f"{entry.path!r} is listed with chunks that do not add up to its size")
    # Under its own name: a temporary name beside it could be another listed file's (a tree
    # may hold both "f" and ".f.partial"); a failed restore leaves the workspace to be reset.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(f"{root}/{entry.path}", flags, 0o600), "wb") as out:
        for chunk in entry.chunks:
            if chunk.size == store.chunk_size <= _ZEROS_UP_TO and chunk.sha256 == _zeros_digest(chunk.size):
                out.seek(chunk.size, os.SEEK_CUR)  # known without fetching; left a hole, as saved
            else:
                out.write(store.fetch(backend, chunk, needed_by=entry.path))
        out.truncate()  # the length of a file that ends in a hole
        os.fchmod(out.fileno(), safe_file_mode(entry.mode))


@functools.lru_cache(maxsize=4)
def _zeros_digest(size: int) -> str:
    """The SHA-256 of ``size`` zero bytes: a whole chunk that holds only zeros (of a sparse or
    preallocated file) needs no fetch, and is restored as a hole rather than written. Only for
    whole chunks of at most :data:`_ZEROS_UP_TO` bytes: one digest per chunk size, computed once
    (a digest per size of each file's last chunk would hash the tree's size in zeros again)."""
    digest = hashlib.sha256()
    for _ in range(size // COPY_CHUNK):
        digest.update(_ZEROS)
    digest.update(_ZEROS[: size % COPY_CHUNK])
    return digest.hexdigest()
