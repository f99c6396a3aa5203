"""The package's imports run one way: down the layers, with no circle, and no import hidden in a
function to dodge one.

Every import counts here, at module level, inside a function or under ``if TYPE_CHECKING:``: a
circle that only a deferred import keeps from failing is still a circle in the design.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flyte_checkpoint"
ROOT = PACKAGE.name

LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "errors tree_removal cpu_quota",
        "environment lockfiles progress running newest_file steps strict_settings timebounds",
        "uris archive",
        "storage",
        "incremental",
        "preemption",
        "single",
        "context",
        "runners state",
        "distributed",
        "integrations",
        "__init__",
        "cli",
        "__main__",
    )
)
"""Top-level modules and subpackages of ``flyte_checkpoint``, lowest first: an import goes to its
own part or to a lower layer, never up or across."""

DEFERRED_IMPORTS: dict[str, str] = {
    **{
        f"{ROOT}.cli.{command_group}": "start-up: `flyte-checkpoint --help` and a mistyped call answer "
        "without loading stores"
        for command_group in ("listing", "objects", "parser", "run")
    },
    f"{ROOT}.storage": "a local-only program never imports fsspec (the object-store base imports it)",
    f"{ROOT}.state.checkpoint": "the `ray` extra: state.ray imports ray, needed only for actor handles",
}
"""The only modules that import modules of this package inside functions, and why. None of them
dodges a circle: :func:`test_the_package_has_no_import_circle` counts those imports too."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def owning_module(name: str) -> str | None:
    """The package module ``name`` is (or is defined in): ``a.b.Class`` is in ``a.b``."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> Iterator[tuple[str, bool]]:
    """Each package module ``module`` imports, and whether that import is inside a function."""
    path = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    in_function = {
        id(node)
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            found = owning_module(name) if name.split(".")[0] == ROOT else None
            if found is not None and found != module:
                yield found, id(node) in in_function


def part_of(module: str) -> str:
    """The top-level module or subpackage ``module`` belongs to (``__init__`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(part: str) -> int:
    for index, layer in enumerate(LAYERS):
        if part in layer:
            return index
    raise AssertionError(f"{part} is in no layer of LAYERS: add it where its imports put it")


def circles() -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan's)."""
    graph = {module: sorted({target for target, _ in imports_of(module)}) for module in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_the_package_has_no_import_circle() -> None:
    assert circles() == []


@pytest.mark.parametrize("module", sorted(modules()))
def test_a_module_imports_only_its_own_part_of_the_package_and_the_layers_below(module: str) -> None:
    own = part_of(module)
    upward = sorted(
        {
            target
            for target, _ in imports_of(module)
            if part_of(target) != own and layer_of(part_of(target)) >= layer_of(own)
        }
    )
    assert upward == [], f"{module} imports {upward}, which are not below {own} in LAYERS"


def test_only_the_listed_modules_import_the_package_inside_functions() -> None:
    deferring = {module for module in modules() for _, deferred in imports_of(module) if deferred}
    assert deferring == set(DEFERRED_IMPORTS)


def test_the_checkpoint_helper_and_the_layers_below_it_never_import_the_task_context() -> None:
    below = [module for module in modules() if layer_of(part_of(module)) <= layer_of("single")]
    assert below
    reaching = sorted(
        module for module in below for target, _ in imports_of(module) if target == f"{ROOT}.context"
    )
    assert reaching == []
