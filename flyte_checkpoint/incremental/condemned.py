"""The condemned record of a chunk store: the chunks a garbage collection found unreferenced.

A collection never deletes a chunk the first time it finds it unreferenced; it writes this
record (one object, replaced atomically) naming each such chunk with the modification time it
had then. A later collection deletes only chunks named here (see :mod:`.gc`), and a save treats
every chunk named here as missing, so it uploads it again (see :mod:`.save`).
"""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import dataclass

from flyte_checkpoint.incremental.chunks import put_object
from flyte_checkpoint.storage import Backend

logger = logging.getLogger("flyte_checkpoint")

CONDEMNED = "condemned.json"
"""The record's name in its store: ``{store}/condemned.json``."""


@dataclass(frozen=True)
class Condemned:
    """A condemned record: when it was written (the store's clock) and each chunk it names with
    the modification time that chunk had when it was condemned."""

    written: datetime.datetime | None
    chunks: dict[str, datetime.datetime]


NOTHING_CONDEMNED = Condemned(written=None, chunks={})


def condemned_uri(store: str) -> str:
    """The object holding the condemned record of the chunk store at ``store``."""
    return f"{store}/{CONDEMNED}"


def read_condemned(backend: Backend, store: str) -> Condemned:
    """The store's condemned record; nothing condemned if there is none or it is damaged.

    A damaged record deletes nothing (a collection deletes only what a readable record names)
    and the next collection replaces it, so reading it as empty is safe for saves too.
    """
    uri = condemned_uri(store)
    reader = backend.open_read(uri)
    if reader is None:
        return NOTHING_CONDEMNED
    with reader:
        written = reader.info.modified
        data = reader.readall()
    try:
        document = json.loads(data)
        chunks = {
            digest: datetime.datetime.fromisoformat(when) for digest, when in document["chunks"].items()
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        logger.warning("ignoring the damaged condemned-chunk record %s; it is replaced next collection", uri)
        return NOTHING_CONDEMNED
    return Condemned(written=written, chunks=chunks)


def write_condemned(backend: Backend, store: str, chunks: dict[str, datetime.datetime]) -> None:
    """Replace the store's condemned record with ``chunks`` (digest: its modification time)."""
    document = {"chunks": {digest: when.isoformat() for digest, when in sorted(chunks.items())}}
    put_object(backend, condemned_uri(store), json.dumps(document).encode(), "payload")
