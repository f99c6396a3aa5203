"""The public face: what the package promises is what its documented modules export, and nothing a
reader is shown is internal.

The rule ("How it works" → "The public face"): the public API is the ``__all__`` of the modules in
:data:`~tests.docs.test_docs.PUBLIC_MODULES`, the errors of ``flyte_checkpoint.errors`` and the
``flyte-checkpoint`` command. Every other module is internal, ``_``-prefixed or not, and may move
between releases; a ``_`` prefix marks a module (or name) internal even inside a public package.
So no public module or exported name, and no import or reference entry the documentation shows,
has a ``_``-prefixed part, and each of them resolves.

Read from the source, as ``tests/docs/test_docs.py`` reads ``__all__``: importing the integrations
would import Lightning and transformers.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.docs.test_docs import PUBLIC_MODULES, exported_names

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "flyte_checkpoint"
DOCUMENTED_ELSEWHERE = ("flyte_checkpoint.errors",)
"""Public modules without an ``__all__`` of their own: the errors, named by the error guide."""

FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+(flyte_checkpoint[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M
)
PLAIN_IMPORT = re.compile(r"^[ \t]*import[ \t]+(flyte_checkpoint[\w.]*)", re.M)
REFERENCE_ENTRY = re.compile(r"^:::[ \t]*(flyte_checkpoint[\w.]*)", re.M)


def source_of(module: str) -> Path | None:
    """The file of package module ``module`` (its ``__init__.py`` for a package), if there is one."""
    path = ROOT / Path(*module.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@cache
def top_level_names(module: str) -> frozenset[str]:
    """What ``from module import NAME`` can import: its top-level definitions, imports and, for a
    package, its submodules."""
    path = source_of(module)
    assert path is not None, f"{module} is no module of the package"
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    if path.name == "__init__.py":
        names.update(child.stem for child in path.parent.iterdir() if child.suffix == ".py" or child.is_dir())
    return frozenset(names)


def is_internal(name: str) -> bool:
    """Whether ``name`` is ``_``-prefixed (a dunder such as ``__version__`` is not)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def internal_parts(dotted: str) -> list[str]:
    return [part for part in dotted.split(".") if is_internal(part)]


def documented_files() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").glob("*.py")])


def imported_names(clause: str) -> list[str]:
    """The names of an import clause: ``a, b as c`` or ``(a, b)``, a trailing comment dropped."""
    clause = re.sub(r"#[^\n]*", "", clause).strip("() \t\n")
    return [item.split()[0] for item in clause.split(",") if item.strip()]


def documented_imports() -> list[tuple[str, str, str | None]]:
    """Every ``(file, module, name)`` an import shown by the documentation or the examples names
    (``name`` is ``None`` for ``import module``), and every reference entry (``::: module``)."""
    found: list[tuple[str, str, str | None]] = []
    for path in documented_files():
        text = path.read_text(encoding="utf-8")
        shown = str(path.relative_to(ROOT))
        for match in FROM_IMPORT.finditer(text):
            found += [(shown, match.group(1), name) for name in imported_names(match.group(2))]
        found += [(shown, match.group(1), None) for match in PLAIN_IMPORT.finditer(text)]
        found += [(shown, match.group(1), None) for match in REFERENCE_ENTRY.finditer(text)]
    return sorted(set(found), key=lambda item: (item[0], item[1], item[2] or ""))


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a package module, or a name importable from one."""
    if source_of(dotted) is not None:
        return True
    module, _, name = dotted.rpartition(".")
    return source_of(module) is not None and name in top_level_names(module)


@pytest.mark.parametrize("module", [*PUBLIC_MODULES, *DOCUMENTED_ELSEWHERE])
def test_a_public_module_has_a_public_path(module: str) -> None:
    assert source_of(module) is not None, f"{module} is no module of the package"
    assert internal_parts(module) == [], f"public module {module} has a _-prefixed part"


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_a_public_module_exports_public_names_that_resolve(module: str) -> None:
    exported = exported_names(module)
    assert exported, f"{module} has no __all__: its public names are not listed"
    internal = [name for name in exported if is_internal(name)]
    assert internal == [], f"{module} exports internal names {internal}"
    unresolved = [
        f"{name} (from {origin})"
        for name, origin in exported.items()
        if name not in top_level_names(module) or not resolves(f"{origin}.{name}")
    ]
    assert unresolved == [], f"{module}.__all__ names what it does not define or import: {unresolved}"


@pytest.mark.parametrize(
    ("shown_in", "module", "name"),
    documented_imports(),
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_every_import_the_documentation_shows_is_public_and_resolves(
    shown_in: str, module: str, name: str | None
) -> None:
    dotted = module if name is None else f"{module}.{name}"
    assert internal_parts(dotted) == [], f"{shown_in} shows internal {dotted}"
    assert resolves(dotted), f"{shown_in} shows {dotted}, which does not resolve"


def test_the_documentation_shows_imports_to_check() -> None:
    shown = {module for _, module, _ in documented_imports()}
    assert {"flyte_checkpoint", "flyte_checkpoint.state", "flyte_checkpoint.distributed"} <= shown
