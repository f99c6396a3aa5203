"""Validated settings values that refuse a misspelt field by name, and the errors they raise.

``TransferSettings`` and ``ExtractionLimits`` are pydantic models a user builds by hand: a field
pydantic would ignore (a misspelling) or an invalid value is a
:class:`~flyte_checkpoint.errors.ConfigurationError` naming it, the closest accepted name and
every accepted one, never a silent default.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from flyte_checkpoint.errors import ConfigurationError


def unknown_option(
    name: str, accepted: Sequence[str], where: str, noun: str = "storage option"
) -> ConfigurationError:
    """The error for storage option ``name`` (or another ``noun``), which ``where`` does not
    accept (empty ``accepted``: the list could not be had)."""
    close = difflib.get_close_matches(name, accepted, n=1)
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(accepted) or "see the fsspec implementation's documentation"
    return ConfigurationError(
        f"{noun} {name!r} is not accepted by {where}{suggestion}; check its spelling or "
        f"remove it. Accepted: {listed}"
    )


def validation_error(exc: ValidationError, where: str, noun: str = "storage option") -> ConfigurationError:
    """The :class:`ConfigurationError` for a setting pydantic refused (``noun``: how the setting
    was given, e.g. a storage option or a ``TransferSettings`` field)."""
    problems = "; ".join(
        f"{noun} {'.'.join(str(part) for part in error['loc'])!r}={error.get('input')!r}: {error['msg']}"
        for error in exc.errors()
    )
    return ConfigurationError(f"invalid {noun}s for {where}: {problems}")


class StrictSettings(BaseModel):
    """A frozen settings value whose unknown fields and invalid values raise
    :class:`~flyte_checkpoint.errors.ConfigurationError` (see the module)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    NOUN: ClassVar[str] = "setting"
    """What one field is called in errors (e.g. "transfer setting")."""

    def __init__(self, **settings: Any) -> None:
        """Refuse, as :class:`~flyte_checkpoint.errors.ConfigurationError`, a field that does
        not exist (naming the closest one and every accepted one) and an invalid value."""
        cls = type(self)
        fields = tuple(cls.model_fields)
        for name in settings:
            if name not in fields:
                raise unknown_option(name, fields, cls.__name__, noun=cls.NOUN)
        try:
            super().__init__(**settings)
        except ValidationError as exc:
            # The pydantic error stays as the cause: callers may word it their own way.
            raise validation_error(exc, cls.__name__, noun=cls.NOUN) from exc
