"""What every benchmark's ``--json-out PATH`` must hold: the printed report and how it was made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def assert_json_out_is_the_report(report: dict[str, Any], json_out: Path, benchmark: str) -> None:
    written = json.loads(json_out.read_text())
    produced = written.pop("produced")
    assert written == report
    assert produced["benchmark"] == benchmark
    assert produced["arguments"][-2:] == ["--json-out", str(json_out)]
