"""The progress bar drawn on a terminal for transfers of a few MiB or more."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_BAR_THRESHOLD = 4 << 20
"""Transfers smaller than this finish before a bar is worth drawing."""


@contextmanager
def progress_bar(
    description: str, quiet: bool, *, estimate: int | None = None
) -> Iterator[Callable[[int, int | None], None] | None]:
    """A progress callback drawing a bar on a terminal, for transfers over a few MiB.

    Sizes and speeds are in binary units (KiB, MiB, GiB). ``estimate`` stands in for a total
    the transfer does not know (a directory's archive): the bar then says it is an estimate and
    fills up at the end, however far the estimate was off.
    """
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bars: list[Any] = []

    def update(done: int, total: int | None) -> None:
        if total is None and estimate is not None:
            total = max(estimate, done)
            if bars and bars[0].total != total:
                bars[0].total = total
        if not bars:
            if max(done, total or 0) < _BAR_THRESHOLD:
                return
            # A terminal that reports no size (a bare pty) would get a zero-size, hidden bar.
            size = shutil.get_terminal_size((100, 24))
            bars.append(
                tqdm(
                    ncols=size.columns or 100,
                    nrows=size.lines or 24,
                    total=total,
                    desc=description,
                    # tqdm scales with "k", "M", "G"; "iB" makes its labels say MiB, as the
                    # divisor means (plain "B" showed MB for MiB).
                    unit="iB",
                    unit_scale=True,
                    unit_divisor=1024,
                    file=sys.stderr,
                )
            )
        bar = bars[0]
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars:
            if estimate is not None:  # the estimate was only that: end at what was written
                bar.total = bar.n
                bar.refresh()
            bar.close()
