"""TaskContext exposes the torchrun variables, so a rank finds its position without arguments."""

from __future__ import annotations

import pytest

from flyte_checkpoint import ConfigurationError, TaskContext

# tests/state/conftest.py clears RANK, WORLD_SIZE and the rest before every test.


def test_outside_a_launcher_a_process_is_rank_0_of_1() -> None:
    context = TaskContext()
    assert (context.rank, context.local_rank, context.world_size, context.local_world_size) == (0, 0, 1, 1)
    assert context.master_addr is None
    assert context.master_port is None


def test_the_torchrun_variables_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": " 10.0.0.7 ",
        "MASTER_PORT": "29500",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    context = TaskContext()
    assert (context.rank, context.local_rank, context.world_size, context.local_world_size) == (5, 1, 8, 4)
    assert context.master_addr == "10.0.0.7"
    assert context.master_port == 29500


def test_the_variables_are_read_at_access_time(monkeypatch: pytest.MonkeyPatch) -> None:
    context = TaskContext()
    monkeypatch.setenv("RANK", "3")
    assert context.rank == 3


@pytest.mark.parametrize(
    ("name", "value", "attribute"),
    [
        ("RANK", "two", "rank"),
        ("RANK", "-1", "rank"),
        ("LOCAL_RANK", "1.5", "local_rank"),
        ("WORLD_SIZE", "0", "world_size"),
        ("LOCAL_WORLD_SIZE", "many", "local_world_size"),
        ("MASTER_PORT", "http", "master_port"),
        ("MASTER_PORT", "70000", "master_port"),
        ("MASTER_PORT", "0", "master_port"),
    ],
)
def test_a_malformed_variable_is_a_configuration_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, attribute: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=f"{name}='{value}'"):
        getattr(TaskContext(), attribute)


def test_a_blank_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "  ")
    monkeypatch.setenv("MASTER_ADDR", "")
    assert TaskContext().rank == 0
    assert TaskContext().master_addr is None
