"""``benchmarks/incremental.py`` still measures what it reports, at a tiny size.

Not a timed test: it checks every figure is produced, and the ones that do not depend on timing:
incremental saves of a growing directory move each byte once and store the directory once.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import incremental


def test_incremental_saves_move_each_new_byte_once_and_plain_ones_all_of_them(tmp_path: Path) -> None:
    pool = []
    for step in range(3):
        pool.append(tmp_path / f"pool-{step}.bin")
        pool[-1].write_bytes(os.urandom(64 * 1024))
    plain, incremental_run = (
        incremental.run(kind, pool, str(tmp_path / kind / "checkpoint"), {}, tmp_path)
        for kind in ("plain", "incremental")
    )
    for result in (plain, incremental_run):
        assert len(result["walls_s"]) == 3
        assert result["last_over_first"] > 0
        assert result["directory_bytes"] == 3 * 64 * 1024
    manifests = incremental_run["moved_bytes"] - incremental_run["directory_bytes"]
    assert 0 < manifests < 3 * 1024  # the chunks once, plus three small manifests
    assert incremental_run["stored_bytes"] < 1.01 * incremental_run["directory_bytes"]
    assert plain["moved_bytes"] > 2 * plain["directory_bytes"]  # 1 + 2 + 3 files' worth
