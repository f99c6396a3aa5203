"""The conventions that tell the documentation tests what to do with a block."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import ILLUSTRATIVE, ROOT, blocks_of, console_commands, programs


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_continued_block_joins_the_program_before_it(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "```python\nx = 1\n```\n\ntext\n\n<!-- docs: continued -->\n```python\nassert x == 1\n```\n\n"
        "```python\ny = 2\n```\n",
    )
    found = programs([page])
    assert [program.parts for program in found] == [("x = 1\n", "assert x == 1\n"), ("y = 2\n",)]


def test_a_continuation_with_nothing_to_continue_is_refused(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- docs: continued -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="continues no python block"):
        programs([page])


def test_an_illustrative_marker_may_give_its_reason(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- docs: illustrative (your credentials) -->\n```bash\nexport A=1\n```\n")
    assert [block.marker for block in blocks_of(page)] == [ILLUSTRATIVE]


def test_a_marker_counts_only_on_the_line_before_the_fence(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- docs: continued -->\n\nsome text\n\n```python\nx = 1\n```\n")
    assert [block.marker for block in blocks_of(page)] == [None]


def test_blocks_shown_inside_a_longer_fence_are_not_examples(tmp_path: Path) -> None:
    page = _page(tmp_path, "````markdown\n```python\nraise SystemExit\n```\n````\n")
    assert [block.language for block in blocks_of(page)] == ["markdown"]


def test_a_console_block_is_commands_with_the_output_shown_after_each(tmp_path: Path) -> None:
    page = _page(tmp_path, "```console\n$ echo a\na\n$ true\n$ printf 'b\\nc'\nb\nc\n```\n")
    (block,) = blocks_of(page)
    assert console_commands(block) == [("echo a", ["a"]), ("true", []), ("printf 'b\\nc'", ["b", "c"])]


def _hook(name: str) -> Any:
    """``docs/hooks/<name>.py``, loaded from its file as MkDocs loads it: docs/ is no package."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sphinx_roles() -> Any:
    return _hook("sphinx_roles")


def test_sphinx_roles_in_docstrings_become_code_spans() -> None:
    text = ":class:`~flyte_checkpoint.errors.CheckpointError`, :meth:`close`, :mod:`.retry`, :func:`x <a.b>`"
    assert _sphinx_roles().plain_roles(text) == "`CheckpointError`, `close`, `retry`, `x`"


def test_the_marks_of_literal_blocks_in_docstrings_are_not_shown() -> None:
    text = "Use it::\n\n    x = 1\n\nor\n\n::\n\n    y = 2\n"
    assert _sphinx_roles().plain_roles(text) == "Use it:\n\n    x = 1\n\nor\n\n\n    y = 2\n"


def test_inline_code_is_kept_whole_between_its_spaces_and_code_blocks_are_left_alone() -> None:
    html = "<p><code>pip install '.[s3]'</code></p><pre><code>a-b c</code></pre>"
    assert _hook("inline_code").words_kept_whole(html) == (
        '<p><code><span class="fc-word">pip</span> <span class="fc-word">install</span> '
        "<span class=\"fc-word\">'.[s3]'</span></code></p><pre><code>a-b c</code></pre>"
    )


def test_a_dotted_name_in_inline_code_may_break_after_its_dots_only() -> None:
    html = "<code>gcsfs.GCSFileSystem v0.1.0</code>"
    assert _hook("inline_code").words_kept_whole(html) == (
        '<code><span class="fc-word">gcsfs.<wbr>GCSFileSystem</span> '
        '<span class="fc-word">v0.1.0</span></code>'
    )
