"""Saving several components with user metadata and loading them back, and what a load rejects."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flyte_checkpoint import (
    CheckpointNotFoundError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
)
from flyte_checkpoint.state import (
    Manifest,
    begin,
    commit,
    load_checkpoint,
    read_part,
    save_checkpoint,
    verify_checkpoint,
    write_part,
)
from flyte_checkpoint.storage import backend_for
from tests.state.workers import Controller, Notes, Unit
from tests.stores import Store


def saved_units() -> list[Unit]:
    return [Unit({index: f"value {index}", 100 + index: list(range(index))}) for index in range(4)]


def test_several_components_and_metadata_round_trip(any_store: Store) -> None:
    checkpoint_dir = any_store.uri("ckpt")
    controller = Controller({1, 2, 3}, step=1000)
    save_checkpoint(
        checkpoint_dir,
        controller=controller,
        parts=saved_units(),
        metadata={"step": 1000, "note": "résumé", "nested": {"lr": 0.1}},
        storage_options=any_store.storage_options,
    )

    restored_controller = Controller()
    restored = [Unit() for _ in range(4)]
    metadata = load_checkpoint(
        checkpoint_dir,
        controller=restored_controller,
        parts=restored,
        storage_options=any_store.storage_options,
    )

    assert metadata == {"step": 1000, "note": "résumé", "nested": {"lr": 0.1}}
    assert restored_controller.state_dict() == controller.state_dict()
    assert [unit.data for unit in restored] == [unit.data for unit in saved_units()]


def test_components_that_stream_their_own_files_round_trip(store: Store) -> None:
    checkpoint_dir = store.uri("ckpt")
    save_checkpoint(
        checkpoint_dir,
        controller=Notes("controller notes"),
        parts=[Notes("part zero"), Unit({1: "pickled"}), Notes("")],
        storage_options=store.storage_options,
    )
    controller, first, second, third = Notes(), Notes(), Unit(), Notes("not empty")
    load_checkpoint(
        checkpoint_dir,
        controller=controller,
        parts=[first, second, third],
        storage_options=store.storage_options,
    )
    assert (controller.text, first.text, second.data, third.text) == (
        "controller notes",
        "part zero",
        {1: "pickled"},
        "",
    )


def test_a_part_count_mismatch_is_a_value_error_naming_both_counts(store: Store) -> None:
    checkpoint_dir = store.uri("ckpt")
    save_checkpoint(
        checkpoint_dir, controller=None, parts=saved_units(), storage_options=store.storage_options
    )
    running = [Unit({9: "untouched"}) for _ in range(3)]
    with pytest.raises(ValueError, match=r"has 4 parts, but the running system has 3") as caught:
        load_checkpoint(checkpoint_dir, controller=None, parts=running, storage_options=store.storage_options)
    assert isinstance(caught.value, InvalidCheckpointInputError)
    assert [unit.data for unit in running] == [{9: "untouched"}] * 3


def test_loading_where_nothing_was_saved_is_file_not_found(store: Store) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(
            store.uri("never-saved"), controller=None, parts=[Unit()], storage_options=store.storage_options
        )


def test_a_save_that_never_committed_is_not_loadable(any_store: Store) -> None:
    checkpoint_dir = any_store.uri("ckpt")
    version = begin(checkpoint_dir, storage_options=any_store.storage_options)
    write_part(
        checkpoint_dir, 0, Unit({0: "orphan"}), version_id=version, storage_options=any_store.storage_options
    )
    with pytest.raises(CheckpointNotFoundError, match="none was ever committed"):
        load_checkpoint(
            checkpoint_dir, controller=None, parts=[Unit()], storage_options=any_store.storage_options
        )


def test_the_layout_has_a_pointer_a_manifest_metadata_and_one_object_per_part(local_store: Store) -> None:
    checkpoint_dir = Path(local_store.uri("ckpt"))
    manifest = save_checkpoint(
        checkpoint_dir, controller=Controller(), parts=saved_units()[:2], metadata={"step": 7}
    )
    pointer = json.loads((checkpoint_dir / "COMMITTED.json").read_text())
    version_dir = checkpoint_dir / "versions" / pointer["version_id"]
    assert sorted(path.name for path in version_dir.iterdir()) == [
        "controller.bin",
        "manifest.json",
        "metadata.json",
        "part-00000.bin",
        "part-00001.bin",
    ]
    assert json.loads((version_dir / "metadata.json").read_text())["user_metadata"] == {"step": 7}
    stored = Manifest.model_validate_json((version_dir / "manifest.json").read_text())
    assert stored == manifest
    assert [part.position for part in stored.parts] == [0, 1]
    assert all(part.digest.startswith("crc32:") and part.size > 0 and part.part_id for part in stored.parts)


def test_a_copied_checkpoint_directory_stays_loadable(local_store: Store, tmp_path: Path) -> None:
    original = Path(local_store.uri("ckpt"))
    save_checkpoint(original, controller=None, parts=saved_units())
    copy = tmp_path / "elsewhere" / "ckpt"
    shutil.copytree(original, copy)
    restored = [Unit() for _ in range(4)]
    load_checkpoint(copy, controller=None, parts=restored)
    assert [unit.data for unit in restored] == [unit.data for unit in saved_units()]


def test_a_controller_in_the_checkpoint_must_be_given_to_load_it(local_store: Store) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    save_checkpoint(checkpoint_dir, controller=Controller({1}), parts=[Unit()])
    with pytest.raises(InvalidCheckpointInputError, match="holds a controller state"):
        load_checkpoint(checkpoint_dir, controller=None, parts=[Unit()])


def test_metadata_that_is_not_json_is_rejected_before_anything_is_written(local_store: Store) -> None:
    checkpoint_dir = Path(local_store.uri("ckpt"))
    with pytest.raises(InvalidCheckpointInputError, match="JSON"):
        save_checkpoint(checkpoint_dir, controller=None, parts=[Unit()], metadata={"when": object()})
    assert not checkpoint_dir.exists()


def test_an_object_without_the_component_protocol_is_a_type_error(local_store: Store) -> None:
    with pytest.raises(UnsupportedTypeError, match=r"part 1 is a dict.*state_dict\(\)"):
        save_checkpoint(local_store.uri("ckpt"), controller=None, parts=[Unit(), {"a": 1}])  # type: ignore[list-item]


def test_a_part_stored_as_raw_bytes_is_read_back_as_bytes(any_store: Store) -> None:
    checkpoint_dir = any_store.uri("ckpt")
    version = begin(checkpoint_dir, storage_options=any_store.storage_options)
    write_part(
        checkpoint_dir, 0, b"\x00raw part", version_id=version, storage_options=any_store.storage_options
    )
    commit(checkpoint_dir, version, world_size=1, storage_options=any_store.storage_options, timeout=30)
    assert (
        read_part(checkpoint_dir, 0, world_size=1, storage_options=any_store.storage_options)
        == b"\x00raw part"
    )
    with pytest.raises(InvalidCheckpointInputError, match="saved as 'bytes'"):
        load_checkpoint(
            checkpoint_dir, controller=None, parts=[Unit()], storage_options=any_store.storage_options
        )


def test_verify_reads_every_part_without_restoring_anything(store: Store) -> None:
    checkpoint_dir = store.uri("ckpt")
    saved = save_checkpoint(
        checkpoint_dir, controller=Controller(), parts=saved_units(), storage_options=store.storage_options
    )
    assert verify_checkpoint(checkpoint_dir, world_size=4, storage_options=store.storage_options) == saved
    assert verify_checkpoint(checkpoint_dir, read_parts=False, storage_options=store.storage_options) == saved


def test_saving_again_replaces_the_checkpoint_and_removes_the_old_version(any_store: Store) -> None:
    checkpoint_dir = any_store.uri("ckpt")
    first = save_checkpoint(
        checkpoint_dir, controller=None, parts=[Unit({0: 1})], storage_options=any_store.storage_options
    )
    second = save_checkpoint(
        checkpoint_dir, controller=None, parts=[Unit({0: 2})], storage_options=any_store.storage_options
    )
    restored = Unit()
    load_checkpoint(
        checkpoint_dir, controller=None, parts=[restored], storage_options=any_store.storage_options
    )
    assert restored.data == {0: 2}
    listed = backend_for(checkpoint_dir, any_store.storage_options).list_prefix(checkpoint_dir)
    assert not any(first.version_id in uri for uri in listed)
    assert any(second.version_id in uri for uri in listed)
