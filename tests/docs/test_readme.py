"""Every name the README and the documentation pages show a user is importable the way they show it.

The imports of the pages' own blocks are checked by running them (``tests/docs``); here the
README's, and the class names quoted in the prose of every page."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
PUBLIC_MODULES = ("flyte_checkpoint", "flyte_checkpoint.state", "flyte_checkpoint.distributed")
# Classes of other libraries the pages name (torch's, the Flyte SDK's), where they live.
OTHER_LIBRARIES = {
    "AsyncCheckpointerType": "torch.distributed.checkpoint.state_dict_saver",
    "CheckpointException": "torch.distributed.checkpoint",
    "FileSystemWriter": "torch.distributed.checkpoint",
    "FsspecWriter": "torch.distributed.checkpoint._fsspec_filesystem",
    "StorageReader": "torch.distributed.checkpoint",
    "StorageWriter": "torch.distributed.checkpoint",
    "RuntimeSystemError": "flyte.errors",
    "SignalException": "torch.distributed.elastic.multiprocessing.api",
}


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.MULTILINE)


def _imports() -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    for block in _python_blocks():
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module:
                found += [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(alias.name, None) for alias in node.names]
    return found


# CamelCase words the pages quote that are no Python classes: S3 API actions (one a lifecycle-rule
# action) and a field of Linux's /proc/<pid>/status.
NOT_PYTHON = {"AbortIncompleteMultipartUpload", "CompleteMultipartUpload", "VmHWM"}


def _class_names_in_prose() -> set[str]:
    """CamelCase names in inline code (`RetryPolicy(...)`, `CheckpointError`), not builtins."""
    names = {
        name for page in PAGES for name in re.findall(r"`([A-Z][a-z]+[A-Z][A-Za-z]*)\b", page.read_text())
    }
    return {name for name in names if not hasattr(builtins, name)} - NOT_PYTHON


def test_the_readme_has_python_imports_to_check() -> None:
    assert any(module == "flyte_checkpoint" for module, _ in _imports())


@pytest.mark.parametrize(("module", "name"), _imports(), ids=lambda value: str(value))
def test_every_import_in_the_readme_works(module: str, name: str | None) -> None:
    imported = importlib.import_module(module)
    if name is not None:
        assert hasattr(imported, name), (
            f"the documentation imports {name} from {module}, which has no such name"
        )


@pytest.mark.parametrize("name", sorted(_class_names_in_prose()))
def test_every_class_the_readme_names_is_exported(name: str) -> None:
    if name in OTHER_LIBRARIES:
        assert hasattr(importlib.import_module(OTHER_LIBRARIES[name]), name)
        return
    modules = [importlib.import_module(module) for module in PUBLIC_MODULES]
    assert any(name in getattr(module, "__all__", ()) for module in modules), (
        f"the documentation names {name}, but neither {' nor '.join(PUBLIC_MODULES)} exports it"
    )


def test_every_environment_variable_the_documentation_names_is_read_by_the_code() -> None:
    named = {name for page in PAGES for name in re.findall(r"\bFLYTE_CHECKPOINT_[A-Z_]+\b", page.read_text())}
    code = "".join(path.read_text() for path in (ROOT / "flyte_checkpoint").rglob("*.py"))
    assert named, "the documentation names no FLYTE_CHECKPOINT_ variable"
    unknown = sorted(name for name in named if name not in code)
    assert not unknown, f"the documentation names variables no code reads: {unknown}"
