"""A benchmark's targets: each a named check with its value, its threshold and whether it is met."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from benchmarks.lib.report import print_table


@dataclass
class Check:
    name: str
    value: str
    threshold: str
    met: bool | None
    """``None``: nothing to judge (not measured, or no case of it)."""


def met_text(met: bool | None) -> str:
    return {True: "met", False: "NOT MET", None: "-"}[met]


def print_targets(checks: list[Check], title: str, out: TextIO) -> None:
    """The target table under ``title``, then how many are not met."""
    print(f"\n{title}", file=out)
    print_table(
        [[c.name, c.value, c.threshold, met_text(c.met)] for c in checks],
        ["target", "value", "threshold", "met?"],
        out,
    )
    failed = [c for c in checks if c.met is False]
    print(f"\n{len(failed)} target(s) not met", file=out)
