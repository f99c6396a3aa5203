"""A griffe extension for the reference pages: the docstrings use Sphinx roles
(``:class:`~flyte_checkpoint.errors.CheckpointError```, ``:meth:`close```), which Markdown would
show as written; this turns each into a code span of the name a reader would type. The
reStructuredText mark of a literal block (a paragraph ending in ``::``) becomes one ``:``: the
indented block after it is code in Markdown as well."""

from __future__ import annotations

import re
from typing import Any

import griffe

# :role:`target`, :role:`~dotted.target` (show the last part only), or :role:`text <target>`.
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):`(~?)([^`<]+?)(?:\s*<[^>]+>)?`")


# "as you call::" ends a paragraph that introduces an indented block; a lone "::" line too.
_LITERAL_AFTER_TEXT = re.compile(r"(?m)(\S)::$")
_LONE_LITERAL_MARK = re.compile(r"(?m)^[ \t]*::[ \t]*\n")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2).strip()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target.lstrip('.')}`"


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx role replaced by a code span, and literal-block marks made plain."""
    text = _LONE_LITERAL_MARK.sub("", _ROLE.sub(_shown, text))
    return _LITERAL_AFTER_TEXT.sub(r"\1:", text)


class SphinxRolesToCode(griffe.Extension):
    """Rewrite the roles of every docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
