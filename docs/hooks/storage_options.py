"""MkDocs hook: replaces the marker ``<!-- storage-options-table -->`` with the table of storage
options each store accepts, generated from :func:`flyte_checkpoint.storage.options.option_origins`,
the list behind the "Accepted:" of the error for an unknown option. No list is copied by hand, so
the page and the error message cannot disagree."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- storage-options-table -->"
STORES = (("s3", "S3"), ("gs", "GCS"), ("abfs", "Azure"))


def options_table() -> str:
    """One Markdown table: an option a row, a store a column, and what reads each option."""
    from flyte_checkpoint.storage.options import accepted_anywhere, option_origins

    origins = {scheme: option_origins(scheme) for scheme, _ in STORES}
    header = "| option | " + " | ".join(title for _, title in STORES) + " | local disk | read by |"
    rule = "|---" * (len(STORES) + 3) + "|"
    local = set(accepted_anywhere())
    rows = [header, rule]
    for name in sorted({name for found in origins.values() for name in found}):
        marks = " | ".join("✓" if name in origins[scheme] else "" for scheme, _ in STORES)
        readers = sorted({origins[scheme][name] for scheme, _ in STORES if name in origins[scheme]})
        read_by = "; ".join(f"`{reader}`" for reader in readers)
        rows.append(f"| `{name}` | {marks} | {'✓' if name in local else ''} | {read_by} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Fill in the table where a page asks for it."""
    return markdown.replace(MARKER, options_table()) if MARKER in markdown else markdown
