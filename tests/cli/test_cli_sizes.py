"""Sizes shown to people are in binary units, small ones in bytes."""

from __future__ import annotations

import pytest

from flyte_checkpoint.progress import human_size


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        (0, "0 bytes"),
        (1, "1 byte"),
        (1023, "1023 bytes"),
        (1024, "1.0 KiB"),
        (2048 + 512, "2.5 KiB"),
        (3 << 20, "3.0 MiB"),
        (5 << 30, "5.0 GiB"),
        (7 << 40, "7.0 TiB"),
        (1 << 60, "1024.0 PiB"),
    ],
)
def test_a_size_is_shown_in_the_largest_binary_unit_below_it(size: int, shown: str) -> None:
    assert human_size(size) == shown
