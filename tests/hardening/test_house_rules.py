"""Two of the rules "How it works" lists, checked over the package's source: trees are removed
without recursion, and what is made in the temporary directory carries a held lock.

A name counts however it is reached: ``shutil.rmtree(...)``, ``from shutil import rmtree`` or
``tempfile.mkdtemp`` passed on uncalled.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flyte_checkpoint"

TEMPORARY_MAKERS = frozenset(
    {
        "mkdtemp",
        "mkstemp",
        "mktemp",
        "TemporaryDirectory",
        "TemporaryFile",
        "NamedTemporaryFile",
        "SpooledTemporaryFile",
    }
)
"""What ``tempfile`` makes: left behind by a killed process, none of it would ever be swept."""


def uses_of(module: str, names: frozenset[str], root: Path = PACKAGE) -> Iterator[tuple[Path, int, str]]:
    """Where a module under ``root`` reaches ``module.name`` for a name in ``names``."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in names
                and isinstance(node.value, ast.Name)
                and node.value.id == module
            ):
                yield path, node.lineno, f"{module}.{node.attr}"
            elif isinstance(node, ast.ImportFrom) and node.module == module:
                for alias in node.names:
                    if alias.name in names:
                        yield path, node.lineno, f"from {module} import {alias.name}"


def where(uses: Iterator[tuple[Path, int, str]], allowed: set[str] | None = None) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path, line, what in uses
        if path.relative_to(PACKAGE).as_posix() not in (allowed or set())
    ]


def test_no_module_removes_a_tree_with_shutil_rmtree() -> None:
    # It recurses once per level before Python 3.13: tree_removal.remove_tree does not.
    assert where(uses_of("shutil", frozenset({"rmtree"}))) == []


def test_only_the_lock_file_module_makes_temporary_files_or_directories() -> None:
    # Everywhere else goes through lockfiles.make_locked_directory or create_locked.
    assert where(uses_of("tempfile", TEMPORARY_MAKERS), allowed={"lockfiles.py"}) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import shutil\nshutil.rmtree('x')\n", ["shutil.rmtree"]),
        ("from shutil import rmtree\n", ["from shutil import rmtree"]),
        ("import shutil\nshutil.copytree('a', 'b')\n", []),
    ],
)
def test_the_check_finds_each_spelling(tmp_path: Path, source: str, found: list[str]) -> None:
    (tmp_path / "module.py").write_text(source)
    assert [what for _, _, what in uses_of("shutil", frozenset({"rmtree"}), tmp_path)] == found
