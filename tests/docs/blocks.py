"""The code blocks of the documentation (``docs/**/*.md`` and ``README.md``) and the conventions
that say what a test does with each (documented in ``docs/how-it-works/docs-tests.md``).

- A ```` ```python ```` block is a program: it is run, and type-checked with ``mypy --strict``.
- A block preceded by ``<!-- docs: continued -->`` (on the line before its fence) continues the
  previous ``python`` block of its page: it runs in that block's namespace, and is type-checked
  appended to it.
- A ```` ```bash ```` or ```` ```console ```` block is run (``console``: the lines starting with
  ``$ `` are the commands), unless preceded by ``<!-- docs: illustrative -->`` (a reason may
  follow the word, inside the comment).
- Placeholders a reader replaces with their own values are substituted by the test (see
  :data:`PLACEHOLDERS` in ``tests/docs/test_docs.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONTINUED = "continued"
ILLUSTRATIVE = "illustrative"
# `<!-- docs: continued -->`, or `<!-- docs: illustrative (why) -->`, on the line before a fence.
_MARKER = re.compile(r"^<!-- docs: (continued|illustrative)\b[^>]*-->$")
# A fence closes at a line of as many backticks as it opened with, so a ````markdown block can
# show ```python blocks without their being taken for examples.
_FENCE = re.compile(r"^(`{3,})([\w-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, the marker before it, and its code."""

    path: Path
    line: int
    language: str
    marker: str | None
    code: str

    @property
    def name(self) -> str:
        """``docs/guides/ray.md:12``, the block's place, for test ids and messages."""
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


@dataclass(frozen=True)
class Program:
    """A ``python`` block with the blocks that continue it: what runs and is type-checked as one."""

    blocks: tuple[Block, ...]

    @property
    def name(self) -> str:
        return self.blocks[0].name

    @property
    def module(self) -> str:
        """A module name for the program's file, unique across the documentation."""
        first = self.blocks[0]
        slug = re.sub(r"\W", "_", str(first.path.relative_to(ROOT).with_suffix("")))
        return f"doc_{slug}_{first.line}"

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(block.code for block in self.blocks)


def documentation_files() -> list[Path]:
    """Every Markdown file whose blocks are tested: the README and every page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1].strip()
        marked = _MARKER.match(before)
        marker = marked.group(1) if marked else None
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(path, line, match.group(2), marker, match.group(3)))
    return found


def all_blocks() -> list[Block]:
    return [block for path in documentation_files() for block in blocks_of(path)]


def programs(files: list[Path] | None = None) -> list[Program]:
    """The ``python`` blocks of ``files`` (default: every documentation file), each continuation
    joined to the program it continues."""
    found: list[Program] = []
    for path in documentation_files() if files is None else files:
        current: list[Block] = []
        for block in blocks_of(path):
            if block.language != "python":
                continue
            if block.marker == CONTINUED:
                if not current:
                    raise ValueError(f"{block.name} continues no python block")
                current.append(block)
                continue
            if current:
                found.append(Program(tuple(current)))
            current = [block]
        if current:
            found.append(Program(tuple(current)))
    return found


def shell_blocks() -> list[Block]:
    return [block for block in all_blocks() if block.language in ("bash", "console", "sh", "shell")]


def console_commands(block: Block) -> list[tuple[str, list[str]]]:
    """A ``console`` block's commands (``$ `` lines), each with the output lines shown after it."""
    commands: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands and line.strip():
            commands[-1][1].append(line)
    return commands
