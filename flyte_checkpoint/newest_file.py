"""Finding the newest framework checkpoint inside a restored tree."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def latest_checkpoint(
    root: str | Path,
    glob_pattern: str = "**/last.ckpt",
    *,
    key: Callable[[Path], Any] | None = None,
) -> Path | None:
    """The newest file under ``root`` matching ``glob_pattern``, or ``None`` when there is none.

    "Newest" is the largest ``key`` (default: modification time, then path, so ties are stable).
    A ``root`` that does not exist yields ``None``: a first attempt has nothing restored.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    candidates = [path for path in base.glob(glob_pattern) if path.is_file()]
    if not candidates:
        return None
    return max(candidates, key=key or (lambda path: (path.stat().st_mtime_ns, str(path))))
