"""Loading a multi-part checkpoint never runs code by default: only state-dict content unpickles."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flyte_checkpoint import UntrustedContentError
from flyte_checkpoint.state import PickleSerializer, load_checkpoint, save_checkpoint


class Holder:
    """A component whose state is whatever the test puts in it."""

    def __init__(self, state: Any = None) -> None:
        self.state = state

    def state_dict(self) -> Any:
        return self.state

    def load_state_dict(self, state: Any) -> None:
        self.state = state


class RunsCode:
    """Unpickling this runs a shell command that leaves a file behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_part_that_would_run_code_on_unpickling_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    save_checkpoint(tmp_path / "ckpt", controller=None, parts=[Holder({"step": 1, "x": RunsCode(marker)})])
    with pytest.raises(UntrustedContentError, match=r"posix\.system|os\.system") as refused:
        load_checkpoint(tmp_path / "ckpt", controller=None, parts=[Holder()])
    assert not marker.exists()
    assert "PickleSerializer(trusted=True)" in str(refused.value)


def test_state_dict_content_loads_by_default(tmp_path: Path) -> None:
    state: dict[str, Any] = {
        "model": {"weight": torch.randn(3, 2), "bias": torch.nn.Parameter(torch.zeros(2))},
        "opt": {"step": 7, "lr": 0.1, "betas": (0.9, 0.999), "flags": {True, False}, "none": None},
        "numpy": np.arange(6, dtype=np.float32).reshape(2, 3),
        "dtype": torch.float16,
        "device": torch.device("cpu"),
        "shape": torch.Size([2, 3]),
        "raw": b"\x00\x01",
    }
    save_checkpoint(tmp_path / "ckpt", controller=None, parts=[Holder(state)])
    restored = Holder()
    load_checkpoint(tmp_path / "ckpt", controller=None, parts=[restored])
    assert isinstance(restored.state, dict)
    assert torch.equal(restored.state["model"]["weight"], state["model"]["weight"])
    assert isinstance(restored.state["model"]["bias"], torch.nn.Parameter)
    assert np.array_equal(restored.state["numpy"], state["numpy"])
    assert {key: restored.state[key] for key in ("opt", "dtype", "device", "shape", "raw")} == {
        key: state[key] for key in ("opt", "dtype", "device", "shape", "raw")
    }


def test_a_trusted_serializer_loads_any_pickle(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "ckpt", controller=None, parts=[Holder({"path": Path("/data")})])
    restored = Holder()
    load_checkpoint(
        tmp_path / "ckpt", controller=None, parts=[restored], serializer=PickleSerializer(trusted=True)
    )
    assert restored.state == {"path": Path("/data")}
