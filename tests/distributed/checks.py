"""Loading a DCP checkpoint in the test process (no process group) and naming what it holds."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from flyte_checkpoint.distributed import CheckpointReader
from tests.distributed.programs import full_state


def empty_app_state() -> dict[str, Any]:
    """Unsharded tensors to load a sharded save into (DCP reshards to world size 1)."""
    return {
        "model": {name: torch.full_like(tensor, float("nan")) for name, tensor in full_state(0).items()},
        "extra": {"seed": None, "note": None},
    }


def load_here(root: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    state = empty_app_state()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp_load(state, storage_reader=CheckpointReader(root, storage_options=storage_options), no_dist=True)
    return state


def matches_seed(params: dict[str, torch.Tensor], seed: int) -> bool:
    expected = full_state(seed)
    return params.keys() == expected.keys() and all(
        torch.equal(params[name], expected[name]) for name in expected
    )


def seed_of(state: dict[str, Any], candidates: list[int]) -> int | None:
    """Which candidate save ``state`` is, exactly (parameters and blobs alike), or ``None`` (a mix)."""
    for seed in candidates:
        if matches_seed(state["model"], seed) and state["extra"]["seed"] == seed:
            return seed
    return None
