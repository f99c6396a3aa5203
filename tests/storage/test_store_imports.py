"""A checkpoint on one object store imports that store's client only, and one on local disk none.

Each client costs a quarter to half a second to import (gcsfs pulls google-auth, adlfs
azure-core and azure-storage-blob), before the first byte moves: a task saving to S3 must not
pay for the other two, nor a task saving to local disk for any. Checked in a fresh interpreter,
which has imported nothing yet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.storage_servers import StorageServer, create_bucket

CLIENTS = {"s3": "s3fs", "gs": "gcsfs", "abfs": "adlfs"}
PROGRAM = """
import json, sys
from flyte_checkpoint import Checkpoint
uri, options = sys.argv[1], json.loads(sys.argv[2])
with Checkpoint(uri, storage_options=options) as checkpoint:
    checkpoint.save_sync(bytes(1024))
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in {clients!r})))
"""


@pytest.mark.parametrize("fixture", ["s3_server", "gcs_server", "azure_server"])
def test_saving_to_one_store_imports_no_other_stores_client(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    server: StorageServer = request.getfixturevalue(fixture)
    uri = server.url(create_bucket(server), "ckpt")
    imported = clients_imported_by_a_save(uri, dict(server.storage_options))
    assert imported == {CLIENTS[server.protocol], "fsspec"}


def clients_imported_by_a_save(uri: str, options: dict[str, object]) -> set[str]:
    """The store clients (and fsspec) a fresh interpreter imported to save 1 KiB to ``uri``."""
    program = PROGRAM.format(clients={*CLIENTS.values(), "fsspec"})
    done = subprocess.run(
        [sys.executable, "-c", program, uri, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {name.split(".")[0] for name in json.loads(done.stdout.splitlines()[-1])}


@pytest.mark.parametrize("file_uri", [False, True], ids=["plain-path", "file-uri"])
@pytest.mark.parametrize(
    "options",
    [{}, {"fsync": True}, {"part_size": 8 << 20, "transfer_timeout": 60}],
    ids=["no-options", "fsync", "transfer-settings"],
)
def test_saving_to_local_disk_imports_no_stores_client(
    tmp_path: Path, file_uri: bool, options: dict[str, object]
) -> None:
    # Checking the options against every store's used to import all three clients (3-4 s here).
    target = tmp_path / "ckpt"
    uri = target.as_uri() if file_uri else str(target)
    assert clients_imported_by_a_save(uri, options) == set()


def test_a_local_save_given_s3_options_imports_no_other_stores_client(tmp_path: Path) -> None:
    # One set of options serving an S3 source and a local destination: listing s3fs's options
    # accepts them, so gcsfs and adlfs stay unimported.
    options = {"key": "id", "secret": "secret", "fsync": False}
    assert clients_imported_by_a_save(str(tmp_path / "ckpt"), options) == {"s3fs", "fsspec"}
