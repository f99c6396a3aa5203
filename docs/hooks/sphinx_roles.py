"""A griffe extension for the reference pages: the docstrings use Sphinx roles
(``:class:`~flyte_checkpoint.errors.CheckpointError```, ``:meth:`close```), which Markdown would
show as written; this turns each into a code span of the name a reader would type."""

from __future__ import annotations

import re
from typing import Any

import griffe

# :role:`target`, :role:`~dotted.target` (show the last part only), or :role:`text <target>`.
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):`(~?)([^`<]+?)(?:\s*<[^>]+>)?`")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2).strip()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target.lstrip('.')}`"


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx role replaced by a code span."""
    return _ROLE.sub(_shown, text)


class SphinxRolesToCode(griffe.Extension):
    """Rewrite the roles of every docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
