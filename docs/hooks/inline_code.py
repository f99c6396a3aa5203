"""MkDocs hook: inline code breaks across lines only at its spaces.

Inline code is a token to copy: a command (`pip install '.[s3]'`), a class, an option. Browsers
break a line inside it after a hyphen (`[--` / `verify]`), and the theme anywhere in a long name
(`CheckpointCorru` / `ptError`). CSS alone cannot forbid the first without forbidding every
break, so each run of non-space characters of an inline ``<code>`` is wrapped in a
``<span class="fc-word">`` that ``docs/assets/stylesheets/extra.css`` keeps on one line; the
text, and what a reader copies, is unchanged. A dotted name may still break after a dot
(``gcsfs.`` / ``GCSFileSystem``, a ``<wbr>``): whole, the longest ones widened a table past the
page. Code blocks (``<pre>``) are left alone."""

from __future__ import annotations

import re
from typing import Any

# A code block, kept as is, or an inline code element whose content is plain text (no tags).
_PRE_OR_CODE = re.compile(r"(<pre\b.*?</pre>)|<code>([^<]*)</code>", re.DOTALL)
_WORD = re.compile(r"\S+")
# A dot between two parts of a dotted name (`adlfs.AzureBlobFileSystem`), not `'.[s3]'` nor `0.1.0`.
_NAME_DOT = re.compile(r"(?<=\w)\.(?=[A-Za-z_])")


def words_kept_whole(html: str) -> str:
    """``html`` with each word of each inline ``<code>`` wrapped in a ``fc-word`` span."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return match.group(1)

        def whole(word: re.Match[str]) -> str:
            return f'<span class="fc-word">{_NAME_DOT.sub(".<wbr>", word.group(0))}</span>'

        inner = _WORD.sub(whole, match.group(2))
        return f"<code>{inner}</code>"

    return _PRE_OR_CODE.sub(replace, html)


def on_page_content(html: str, **_: Any) -> str:
    return words_kept_whole(html)
