"""Transfer settings given the wrong way are refused with an error that says how to give them."""

from __future__ import annotations

from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, ConfigurationError


def test_a_dict_given_as_transfer_settings_is_refused_showing_the_typed_spelling(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"write transfer=TransferSettings\(max_concurency=3\)"):
        Checkpoint(tmp_path / "ckpt", transfer={"max_concurency": 3})  # type: ignore[arg-type]
