"""CheckpointManager: numbered steps, keep-last retention, and fall-back to an older good step."""

from __future__ import annotations

import logging

import pytest

from flyte_checkpoint import CheckpointCorruptError, InvalidCheckpointInputError
from flyte_checkpoint.state import CheckpointManager, Manifest, write_part
from flyte_checkpoint.state.layout import Layout
from tests.state.workers import Controller, Unit
from tests.stores import Store


def manager(store: Store, keep_last: int | None = None) -> CheckpointManager:
    return CheckpointManager(store.uri("run"), keep_last=keep_last, storage_options=store.storage_options)


def save_step(checkpoints: CheckpointManager, step: int) -> Manifest:
    return checkpoints.save(
        step,
        controller=Controller({step}, step=step),
        parts=[Unit({0: f"step {step}"}), Unit({1: f"step {step}"})],
        metadata={"step": step},
    )


def damage_a_part(store: Store, checkpoints: CheckpointManager, manifest: Manifest, step: int) -> None:
    layout = Layout.of(checkpoints.checkpoint_dir(step), store.storage_options)
    uri = layout.object_uri(manifest.version_id, manifest.parts[1].name)
    with layout.backend.open_write(uri, {}) as writer:
        writer.write(b"bit rot")


def load(
    checkpoints: CheckpointManager, step: int | None = None
) -> tuple[int | None, Controller, list[Unit]]:
    controller, units = Controller(), [Unit(), Unit()]
    restored = checkpoints.load(step, controller=controller, parts=units)
    return (restored.step if restored else None), controller, units


def test_steps_are_saved_in_numbered_directories_and_the_latest_is_loaded(store: Store) -> None:
    checkpoints = manager(store)
    for step in (1000, 2000, 3000):
        save_step(checkpoints, step)
    assert checkpoints.steps() == [1000, 2000, 3000]
    assert checkpoints.latest_step() == 3000
    assert checkpoints.checkpoint_dir(2000) == store.uri("run/step_2000")

    restored_step, controller, units = load(checkpoints)
    assert restored_step == 3000
    assert controller.step == 3000
    assert [unit.data for unit in units] == [{0: "step 3000"}, {1: "step 3000"}]
    assert checkpoints.resumed_step == 3000


def test_keep_last_keeps_only_the_newest_committed_steps(store: Store) -> None:
    checkpoints = manager(store, keep_last=2)
    for step in (1000, 2000, 3000, 4000):
        save_step(checkpoints, step)
    assert checkpoints.steps() == [3000, 4000]
    listed = Layout.of(store.uri("run"), store.storage_options).backend.list_prefix(store.uri("run"))
    assert not any("step_1000" in uri or "step_2000" in uri for uri in listed)


def test_retention_never_deletes_the_step_being_resumed_from(local_store: Store) -> None:
    first_run = manager(local_store)
    for step in (1000, 2000):
        save_step(first_run, step)
    resumed = manager(local_store, keep_last=1)
    assert load(resumed, 1000)[0] == 1000
    for step in (3000, 4000):
        save_step(resumed, step)
    assert resumed.steps() == [1000, 4000]


def test_a_newest_step_that_fails_verification_falls_back_to_the_previous_one_with_a_warning(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = manager(store)
    save_step(checkpoints, 1000)
    newest = save_step(checkpoints, 2000)
    damage_a_part(store, checkpoints, newest, 2000)

    with caplog.at_level(logging.WARNING, logger="flyte_checkpoint"):
        step, controller, units = load(checkpoints)

    assert step == 1000
    assert controller.step == 1000
    assert [unit.data for unit in units] == [{0: "step 1000"}, {1: "step 1000"}]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(
        "step 2000" in message and "falling back to step 1000" in message and "part 1 is damaged" in message
        for message in warnings
    ), warnings


def test_when_no_step_verifies_the_error_gives_every_reason(local_store: Store) -> None:
    checkpoints = manager(local_store)
    for step in (1000, 2000):
        damage_a_part(local_store, checkpoints, save_step(checkpoints, step), step)
    with pytest.raises(CheckpointCorruptError, match=r"step 2000: .*damaged.*; step 1000: .*damaged"):
        load(checkpoints)


def test_an_explicit_step_is_loaded_or_fails_without_falling_back(local_store: Store) -> None:
    checkpoints = manager(local_store)
    save_step(checkpoints, 1000)
    damage_a_part(local_store, checkpoints, save_step(checkpoints, 2000), 2000)
    assert load(checkpoints, 1000)[0] == 1000
    with pytest.raises(CheckpointCorruptError, match="part 1 is damaged"):
        load(checkpoints, 2000)


def test_a_part_count_mismatch_does_not_fall_back(local_store: Store) -> None:
    checkpoints = manager(local_store)
    save_step(checkpoints, 1000)
    save_step(checkpoints, 2000)
    with pytest.raises(InvalidCheckpointInputError, match="has 2 parts, but the running system has 3"):
        checkpoints.load(controller=Controller(), parts=[Unit(), Unit(), Unit()])


def test_without_a_committed_step_load_returns_none(local_store: Store) -> None:
    assert manager(local_store).load(controller=Controller(), parts=[Unit()]) is None
    assert manager(local_store).latest_step() is None


def test_retention_removes_leftovers_of_saves_that_never_committed(local_store: Store) -> None:
    checkpoints = manager(local_store, keep_last=1)
    orphan_dir = checkpoints.checkpoint_dir(500)
    write_part(orphan_dir, 0, Unit(), version_id=checkpoints.begin(500))
    save_step(checkpoints, 1000)
    save_step(checkpoints, 2000)
    assert checkpoints.steps() == [2000]
    assert not Layout.of(orphan_dir).backend.list_prefix(orphan_dir)


def test_a_multi_process_save_of_a_step_is_committed_through_the_manager(local_store: Store) -> None:
    checkpoints = manager(local_store, keep_last=1)
    save_step(checkpoints, 1000)
    version = checkpoints.begin(2000)
    for rank in range(2):
        write_part(checkpoints.checkpoint_dir(2000), rank, Unit({rank: "from a rank"}), version_id=version)
    checkpoints.commit(
        2000, version, world_size=2, controller=Controller({2}, step=2000), metadata={"step": 2000}
    )
    assert checkpoints.steps() == [2000]
    step, _, units = load(checkpoints)
    assert step == 2000
    assert [unit.data for unit in units] == [{0: "from a rank"}, {1: "from a rank"}]


@pytest.mark.parametrize("keep_last", [0, -1, True, 1.5])
def test_keep_last_must_be_a_positive_int(local_store: Store, keep_last: object) -> None:
    with pytest.raises(InvalidCheckpointInputError, match="keep_last"):
        CheckpointManager(local_store.uri("run"), keep_last=keep_last)  # type: ignore[arg-type]
