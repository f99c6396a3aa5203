"""The layers below the checkpoint helper never import it or the task context (no import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flyte_checkpoint"
ABOVE = ("flyte_checkpoint.context", "flyte_checkpoint.checkpoint")
BELOW = sorted(
    [
        *(PACKAGE / "storage").glob("*.py"),
        *(PACKAGE / "archive").glob("*.py"),
        PACKAGE / "uris.py",
        PACKAGE / "environment.py",
        PACKAGE / "errors.py",
        PACKAGE / "progress.py",
    ]
)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", BELOW, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_below_the_checkpoint_helper_imports_neither_it_nor_the_task_context(path: Path) -> None:
    assert not imported_modules(path) & set(ABOVE)
