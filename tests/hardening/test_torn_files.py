"""A file truncated and rewritten while it is being saved is never committed as sound: the save
fails with InputChangedError and the previous checkpoint stays, on local disk and S3, blocking
and in the background."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, InputChangedError
from tests.storage_servers import StorageServer, create_bucket

MiB = 1 << 20


def destination(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, dict[str, Any] | None]:
    if where == "local":
        return str(tmp_path / "ckpt"), None
    server: StorageServer = request.getfixturevalue("s3_server")
    return f"s3://{create_bucket(server)}/ckpt", server.storage_options


class RewriteOnce:
    """A progress callback that, once the save is under way, truncates the file and writes a
    shorter new version in place, as a second ``torch.save`` to the same name does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done = False

    def __call__(self, done: int, total: int | None) -> None:
        if not self.done and done > 0:
            self.done = True
            with open(self.path, "r+b") as file:
                file.truncate(0)
                file.write(os.urandom(4 * MiB))


def save_and_wait(helper: Checkpoint, source: Path, background: bool, rewrite: RewriteOnce) -> None:
    helper.save_sync(source, background=background, progress=rewrite)
    helper.wait_sync()


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("background", [False, True], ids=["blocking", "background"])
def test_a_file_rewritten_in_place_during_its_save_is_not_committed(
    where: str, background: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dest, options = destination(where, tmp_path, request)
    source = tmp_path / "model.pt"
    source.write_bytes(os.urandom(48 * MiB))
    helper = Checkpoint(dest, storage_options=options)
    helper.save_sync(b"previous")
    rewrite = RewriteOnce(source)
    with pytest.raises(InputChangedError, match=r"model\.pt"):
        save_and_wait(helper, source, background, rewrite)
    assert rewrite.done
    with Checkpoint(tmp_path / "unused", dest, storage_options=options) as reader:
        restored = reader.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"previous"


def test_a_file_replaced_by_a_rename_during_its_save_stores_the_whole_old_version(tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    old = os.urandom(16 * MiB)
    source.write_bytes(old)
    replaced: list[bool] = []

    def rename_over(done: int, total: int | None) -> None:
        if not replaced:
            replaced.append(True)
            (tmp_path / "new.pt").write_bytes(b"new version")
            os.replace(tmp_path / "new.pt", source)

    Checkpoint(tmp_path / "ckpt").save_sync(source, progress=rename_over)
    assert (tmp_path / "ckpt").read_bytes() == old
