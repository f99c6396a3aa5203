"""Known limitation 4 of the spec: a load either restores every component or changes none.

Each test injects a failure into the *last* part, after every other part would have been applied
by a non-transactional load, and checks that every component still holds what it held before.
"""

from __future__ import annotations

from typing import Any

import pytest

from flyte_checkpoint import CheckpointCorruptError, CheckpointError
from flyte_checkpoint.state import (
    Manifest,
    PickleSerializer,
    load_checkpoint,
    objects,
    restore,
    save_checkpoint,
)
from flyte_checkpoint.state.layout import Layout
from tests.state.workers import (
    AlwaysBroken,
    BrokenOnLoad,
    Controller,
    Notes,
    UndecodableValue,
    Unit,
)
from tests.stores import Store


def snapshot(controller: Controller, parts: list[Any]) -> list[Any]:
    return [controller.state_dict()] + [
        part.text if isinstance(part, Notes) else part.state_dict() for part in parts
    ]


def running_system() -> tuple[Controller, list[Any]]:
    """Components holding a live state that a failed load must leave exactly as it is."""
    return Controller({42}, step=9), [Notes("live notes"), Unit({1: "live"}), Unit({2: "live"})]


def save_saved_state(store: Store, last: Any) -> tuple[str, Manifest]:
    checkpoint_dir = store.uri("ckpt")
    manifest = save_checkpoint(
        checkpoint_dir,
        controller=Controller({1, 2, 3}, step=1000),
        parts=[Notes("saved notes"), Unit({1: "saved"}), Unit({2: "saved"}), last],
        storage_options=store.storage_options,
    )
    return checkpoint_dir, manifest


def replace_object(store: Store, checkpoint_dir: str, manifest: Manifest, position: int, data: bytes) -> None:
    layout = Layout.of(checkpoint_dir, store.storage_options)
    uri = layout.object_uri(manifest.version_id, manifest.parts[position].name)
    with layout.backend.open_write(uri, {}) as writer:
        writer.write(data)


def test_a_damaged_last_part_fails_the_load_before_any_component_changes(any_store: Store) -> None:
    checkpoint_dir, manifest = save_saved_state(any_store, Unit({3: "saved"}))
    replace_object(any_store, checkpoint_dir, manifest, 3, b"\x80\x05not the saved state")
    controller, parts = running_system()
    last = Unit({3: "live"})
    before = snapshot(controller, [*parts, last])

    with pytest.raises(CheckpointCorruptError, match=r"part 3 is damaged"):
        load_checkpoint(
            checkpoint_dir,
            controller=controller,
            parts=[*parts, last],
            storage_options=any_store.storage_options,
        )
    assert snapshot(controller, [*parts, last]) == before


def test_a_missing_last_part_fails_the_load_before_any_component_changes(store: Store) -> None:
    checkpoint_dir, manifest = save_saved_state(store, Unit({3: "saved"}))
    layout = Layout.of(checkpoint_dir, store.storage_options)
    layout.backend.delete(layout.object_uri(manifest.version_id, manifest.parts[3].name))
    controller, parts = running_system()
    last = Unit({3: "live"})
    before = snapshot(controller, [*parts, last])

    with pytest.raises(CheckpointCorruptError, match=r"part 3 is missing"):
        load_checkpoint(
            checkpoint_dir, controller=controller, parts=[*parts, last], storage_options=store.storage_options
        )
    assert snapshot(controller, [*parts, last]) == before


def test_a_last_part_that_cannot_be_decoded_fails_the_load_before_any_component_changes(
    store: Store,
) -> None:
    checkpoint_dir, _ = save_saved_state(store, Unit({3: UndecodableValue()}))
    controller, parts = running_system()
    last = Unit({3: "live"})
    before = snapshot(controller, [*parts, last])

    with pytest.raises(CheckpointCorruptError, match=r"part 3 could not be decoded.*cannot be decoded here"):
        load_checkpoint(
            checkpoint_dir,
            controller=controller,
            parts=[*parts, last],
            storage_options=store.storage_options,
            serializer=PickleSerializer(trusted=True),  # the default refuses it before decoding
        )
    assert snapshot(controller, [*parts, last]) == before


def test_a_last_part_that_fails_to_apply_rolls_every_component_back(any_store: Store) -> None:
    checkpoint_dir, _ = save_saved_state(any_store, Unit({3: "saved"}))
    controller, parts = running_system()
    last = BrokenOnLoad({3: "live"})
    before = snapshot(controller, [*parts, last])

    with pytest.raises(
        CheckpointError,
        match=r"part 3 failed: applying its state raised RuntimeError: injected failure while applying; "
        r"every component was rolled back",
    ):
        load_checkpoint(
            checkpoint_dir,
            controller=controller,
            parts=[*parts, last],
            storage_options=any_store.storage_options,
        )
    # The controller and parts 0-2 had been applied, and part 3 half-applied, before the failure.
    assert snapshot(controller, [*parts, last]) == before


def test_a_rollback_that_fails_too_says_the_components_may_be_mixed(local_store: Store) -> None:
    checkpoint_dir, _ = save_saved_state(local_store, Unit({3: "saved"}))
    controller, parts = running_system()
    with pytest.raises(CheckpointError, match=r"rolling back also failed \(part 3: RuntimeError"):
        load_checkpoint(checkpoint_dir, controller=controller, parts=[*parts, AlwaysBroken()])
    # Everything that could be rolled back was.
    assert snapshot(controller, parts) == snapshot(*running_system())


def test_a_load_racing_a_replacing_save_restores_one_whole_version(
    local_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    save_checkpoint(checkpoint_dir, controller=None, parts=[Unit({0: "old"}), Unit({1: "old"})])
    real_fetch = objects.fetch_bytes
    replaced: list[Manifest] = []

    def fetch_after_a_concurrent_save(*args: Any) -> bytes:
        if not replaced:
            # Another process commits a new version (and collects this one) mid-load.
            replaced.append(
                save_checkpoint(checkpoint_dir, controller=None, parts=[Unit({0: "new"}), Unit({1: "new"})])
            )
        return real_fetch(*args)

    monkeypatch.setattr(restore, "fetch_bytes", fetch_after_a_concurrent_save)
    units = [Unit(), Unit()]
    load_checkpoint(checkpoint_dir, controller=None, parts=units, max_workers=1)
    assert [unit.data for unit in units] == [{0: "new"}, {1: "new"}]
