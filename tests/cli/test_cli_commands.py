"""``flyte-checkpoint`` inspect, verify, get, put and ls, run as a user would: as a subprocess."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.cli import EXIT_CONFIGURATION, EXIT_CORRUPT, EXIT_NOT_FOUND
from tests.conftest import damage_in_place, tree_of
from tests.storage.conftest import remote_for
from tests.storage_servers import StorageServer

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flyte_checkpoint", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )


class Counter:
    """A component with state, for the multi-part checkpoints ``ls`` describes."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def test_put_then_get_round_trips_a_directory(tmp_path: Path, model_dir: Path) -> None:
    put = cli("put", str(model_dir), str(tmp_path / "obj"))
    assert put.returncode == 0, put.stderr
    got = cli("get", str(tmp_path / "obj"), str(tmp_path / "restored"))
    assert got.returncode == 0, got.stderr
    assert tree_of(tmp_path / "restored") == tree_of(model_dir)


def test_get_of_a_payload_writes_dir_payload(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(b"raw state")
    assert cli("get", str(tmp_path / "obj"), str(tmp_path / "out")).returncode == 0
    assert (tmp_path / "out" / "payload").read_bytes() == b"raw state"


def test_get_refuses_a_non_empty_directory_unless_forced(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(b"raw state")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    refused = cli("get", str(tmp_path / "obj"), str(tmp_path / "out"))
    assert refused.returncode == EXIT_CONFIGURATION
    assert "--force" in refused.stderr
    assert cli("get", "--force", str(tmp_path / "obj"), str(tmp_path / "out")).returncode == 0
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"
    assert (tmp_path / "out" / "payload").read_bytes() == b"raw state"


def test_get_of_a_corrupt_archive_leaves_the_target_untouched(tmp_path: Path, model_dir: Path) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(model_dir)
    damage_in_place(tmp_path / "obj", 2000, b"\xff\x00\xff")
    result = cli("get", str(tmp_path / "obj"), str(tmp_path / "out"))
    assert result.returncode == EXIT_CORRUPT
    # The whole object's digest, or first the damaged member's own CRC-32 (ArchiveIndexError is a
    # CheckpointCorruptError), whichever the load reaches first.
    assert "CheckpointCorruptError: " in result.stderr or "ArchiveIndexError: " in result.stderr
    assert not (tmp_path / "out").exists()  # the folder the failed get created is gone again
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".flyte-cp-get-")] == []


def test_inspect_json_lists_archive_members_without_extracting(tmp_path: Path, model_dir: Path) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(model_dir)
    result = cli("inspect", str(tmp_path / "obj"), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["kind"] == "archive"
    assert report["size"] == (tmp_path / "obj").stat().st_size
    assert report["recorded_digest"].startswith("crc32:")
    members = {m["name"]: m for m in report["members"]}
    assert members["weights.bin"]["size"] == 300_000
    assert members["shards/rank0/part-0.bin"]["kind"] == "file"


def test_inspect_shows_a_payload_and_its_digest_check(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(b"abc")
    result = cli("inspect", str(tmp_path / "obj"), "--verify")
    assert result.returncode == 0, result.stderr
    assert "raw payload" in result.stdout
    assert "crc32:352441c2" in result.stdout
    assert "yes, every check passed (crc32, size)" in result.stdout


def test_an_incremental_checkpoint_is_described_verified_and_restored(
    tmp_path: Path, model_dir: Path
) -> None:
    with Checkpoint(str(tmp_path / "obj")) as checkpoint:
        checkpoint.save_sync(model_dir, incremental=True)
    inspected = cli("inspect", str(tmp_path / "obj"))
    assert inspected.returncode == 0, inspected.stderr
    assert "incremental checkpoint manifest" in inspected.stdout
    verified = cli("verify", str(tmp_path / "obj"))
    assert verified.returncode == 0, verified.stderr
    assert "not checked: the chunks the manifest lists" in verified.stdout
    got = cli("get", str(tmp_path / "obj"), str(tmp_path / "restored"))
    assert got.returncode == 0, got.stderr
    assert tree_of(tmp_path / "restored") == tree_of(model_dir)


def test_verify_of_an_object_rewritten_by_another_tool_says_what_was_not_checked(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(b"ours, with a digest")
    with open(target, "wb") as handle:  # the reference SDK rewrites in place: xattrs stay, stale
        handle.write(b"theirs, without one")
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 1_000_000))
    result = cli("verify", str(target))
    assert result.returncode == 0, result.stderr
    assert "checked: readable only" in result.stdout
    assert "not checked: content digest and size: none is recorded" in result.stdout
    inspected = cli("inspect", "--verify", str(target))
    assert "every check passed" not in inspected.stdout
    assert "verified:  partly: checked that it reads; NOT checked: content digest" in inspected.stdout


def test_verify_exits_0_for_a_sound_checkpoint(tmp_path: Path, model_dir: Path) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(model_dir)
    result = cli("verify", str(tmp_path / "obj"))
    assert result.returncode == 0, result.stderr
    assert "checked: crc32, size, gzip CRC, tar structure" in result.stdout


def test_verify_exits_5_with_the_reason_for_a_corrupt_checkpoint(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(b"precious bytes")
    damage_in_place(tmp_path / "obj", 0, b"P")
    result = cli("verify", str(tmp_path / "obj"))
    assert result.returncode == EXIT_CORRUPT
    assert "CheckpointCorruptError" in result.stderr
    assert "does not match the digest" in result.stderr


def test_verify_exits_4_when_the_checkpoint_is_absent(tmp_path: Path) -> None:
    result = cli("verify", str(tmp_path / "nothing"))
    assert result.returncode == EXIT_NOT_FOUND
    assert "no checkpoint at" in result.stderr


def test_errors_are_one_line_without_a_traceback(tmp_path: Path) -> None:
    result = cli("put", str(tmp_path / "missing"), str(tmp_path / "obj"))
    assert result.returncode == EXIT_NOT_FOUND
    assert result.stderr.strip().count("\n") == 0
    assert "no such file or directory" in result.stderr


def test_ls_lists_committed_steps_with_metadata(tmp_path: Path) -> None:
    from flyte_checkpoint.state import CheckpointManager

    manager = CheckpointManager(tmp_path / "root")
    for step in (100, 200):
        manager.save(step, controller=Counter(step), parts=[Counter(1), Counter(2)], metadata={"step": step})
    (tmp_path / "root" / "step_300").mkdir()
    result = cli("ls", str(tmp_path / "root"), "--json")
    assert result.returncode == 0, result.stderr
    steps = json.loads(result.stdout)
    assert [(s["step"], s["committed"], s["parts"]) for s in steps] == [
        (100, True, 2),
        (200, True, 2),
        (300, False, None),
    ]
    assert steps[1]["metadata"] == {"step": 200}
    text = cli("ls", str(tmp_path / "root")).stdout
    assert "uncommitted" in text


def test_storage_options_reach_the_backend(s3_server: StorageServer, tmp_path: Path) -> None:
    remote = remote_for("s3", s3_server)
    options = remote.storage_options
    flags = [
        "-o", f"endpoint_url={options['endpoint_url']}",
        "-o", f"key={options['key']}",
        "-o", f"secret={options['secret']}",
        "-o", f"client_kwargs={json.dumps(options['client_kwargs'])}",
    ]  # fmt: skip
    (tmp_path / "state.bin").write_bytes(os.urandom(1 << 20))
    assert cli("put", *flags, str(tmp_path / "state.bin"), remote.uri("cli/obj")).returncode == 0
    verified = cli("verify", *flags, remote.uri("cli/obj"))
    assert verified.returncode == 0, verified.stderr
    got = cli("get", *flags, remote.uri("cli/obj"), str(tmp_path / "out"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "out" / "payload").read_bytes() == (tmp_path / "state.bin").read_bytes()


def run_on_a_terminal(*args: str) -> str:
    """Run the command with stderr on a pseudo-terminal; return what the terminal showed."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "flyte_checkpoint", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=follower,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"},
        )
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closes when the process exits
                break
            if not chunk:
                break
            shown += chunk
        assert process.wait(timeout=120) == 0
        return shown.decode(errors="replace")
    finally:
        os.close(leader)


def test_a_progress_bar_is_drawn_on_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(24 << 20))
    shown = run_on_a_terminal("put", str(tmp_path / "big.bin"), str(tmp_path / "obj"))
    assert "saving" in shown
    assert "100%" in shown


def test_a_directory_put_shows_an_estimated_total_in_binary_units(tmp_path: Path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / "a.bin").write_bytes(os.urandom(12 << 20))
    (source / "b.bin").write_bytes(os.urandom(12 << 20))
    shown = run_on_a_terminal("put", str(source), str(tmp_path / "obj"))
    assert "saving (estimate: 24.0 MiB uncompressed)" in shown
    assert "100%" in shown
    assert "MiB" in shown
    assert "MB" not in shown.replace("MiB", "")


def test_ls_describes_a_multi_part_checkpoint_root(tmp_path: Path) -> None:
    from flyte_checkpoint.state import StateCheckpoint

    root = tmp_path / "state"
    StateCheckpoint(str(root)).save(controller=None, parts=[Counter(1), Counter(2)], metadata={"epoch": 3})
    text = cli("ls", str(root))
    assert text.returncode == 0, text.stderr
    assert "is one multi-part checkpoint (StateCheckpoint)" in text.stdout
    assert "2 parts" in text.stdout
    assert '{"epoch": 3}' in text.stdout
    assert "no steps" not in text.stdout
    described = json.loads(cli("ls", "--json", str(root)).stdout)
    assert (described["kind"], described["parts"], described["metadata"]) == ("state", 2, {"epoch": 3})


def test_quiet_draws_no_bar_even_on_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(24 << 20))
    assert run_on_a_terminal("put", "--quiet", str(tmp_path / "big.bin"), str(tmp_path / "obj")) == ""


def test_no_bar_is_drawn_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(24 << 20))
    result = cli("put", str(tmp_path / "big.bin"), str(tmp_path / "obj"))
    assert result.returncode == 0
    assert result.stderr == ""


@pytest.mark.parametrize("command", ["inspect", "verify", "get", "put", "ls", "run"])
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = cli(command, "--help")
    assert result.returncode == 0
    assert f"example: flyte-checkpoint {command}" in result.stdout
