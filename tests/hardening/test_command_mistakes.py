"""What outsiders hit with the command (issue #30): each mistake gets the exit code of its kind and
a message in our words; 4 ("no checkpoint there", which a script reads as "start over") only when
there is no checkpoint; ``--json`` errors name their kind; each subcommand's help lists only the
statuses it can return, and docs/guides/command.md holds the same table as the code."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.cli import (
    EXIT_CODES,
    EXIT_CONFIGURATION,
    EXIT_CORRUPT,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_OUTPUT_CLOSED,
    EXIT_STORAGE,
    EXIT_TASK_FAILED,
    EXIT_USAGE,
    main,
)
from flyte_checkpoint.state import CheckpointManager, StateCheckpoint
from tests.cli.test_cli_commands import Counter
from tests.conftest import damage_in_place
from tests.hardening.test_command_outcomes import COMMAND, command
from tests.storage.conftest import remote_for
from tests.storage_servers import StorageServer

REPO = Path(__file__).resolve().parents[2]


def saved(tmp_path: Path, data: bytes = b"state") -> Path:
    obj = tmp_path / "ckpt"
    Checkpoint(str(obj)).save_sync(data)
    return obj


def json_error(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


# -- 1: a directory that cannot be written is not "no checkpoint" --------------------------------


def test_get_into_a_directory_the_file_system_will_not_create_is_a_storage_failure_not_no_checkpoint(
    tmp_path: Path,
) -> None:
    obj = saved(tmp_path)
    result = command("get", str(obj), "/proc/flyte-checkpoint-x")
    assert result.returncode == EXIT_STORAGE, result.stderr
    assert "restore into a writable directory" in result.stderr
    assert obj.read_bytes() == b"state"


# -- 2: an empty URI is never the current directory ----------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", ""],
        ["verify", ""],
        ["get", "", "{out}"],
        ["put", "{source}", ""],
        ["ls", ""],
        ["run", "--checkpoint-path", "", "os:getcwd"],
        ["run", "--checkpoint-path", "  ", "os:getcwd"],
        ["put", "", "{out}"],
        ["get", "{obj}", ""],
    ],
    ids=["inspect", "verify", "get", "put", "ls", "run", "run-blank", "put-path", "get-dir"],
)
def test_an_empty_location_is_a_configuration_mistake_on_every_command(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # what an empty location was read as
    source = tmp_path / "state.bin"
    source.write_bytes(b"x")
    names = {"out": str(tmp_path / "out"), "source": str(source), "obj": str(saved(tmp_path))}
    assert main([part.format(**names) for part in argv]) == EXIT_CONFIGURATION
    assert "empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert not any((tmp_path / "cwd").iterdir())


# -- 3: a location that is not a file says what it is ---------------------------------------------


def test_inspect_of_a_device_names_it_a_device_not_a_directory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "/dev/null"]) == EXIT_STORAGE
    said = capsys.readouterr().err
    assert "it is a device node, not a checkpoint file" in said
    assert "directory" not in said


@pytest.mark.timeout(30)
def test_inspect_of_a_fifo_names_it_without_waiting_for_a_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert main(["inspect", str(tmp_path / "fifo")]) == EXIT_STORAGE
    assert "it is a FIFO (named pipe), not a checkpoint file" in capsys.readouterr().err


# -- 4: an invalid bucket name is a bad URI ------------------------------------------------------


@pytest.mark.parametrize("uri", ["s3://bu cket/k", "gs://bu cket/k", "s3://-bucket/k", "abfs://con tainer/k"])
def test_an_invalid_bucket_name_is_a_bad_uri_said_in_our_words(
    uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "state.bin"
    source.write_bytes(b"x")
    assert main(["put", str(source), uri]) == EXIT_CONFIGURATION
    said = capsys.readouterr().err
    assert "UnsupportedURIError" in said
    assert re.search(r"which is not a valid (bucket|container) name", said)
    assert "regex" not in said


# -- 5: malformed --inputs is a bad command line -------------------------------------------------


@pytest.mark.parametrize("inputs", ["{bad", "[1, 2]"], ids=["not-json", "not-an-object"])
def test_malformed_inputs_are_a_bad_command_line(inputs: str, tmp_path: Path) -> None:
    result = command("run", "--checkpoint-path", str(tmp_path / "c"), "json:dumps", "--inputs", inputs)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "argument --inputs:" in result.stderr
    assert "Traceback" not in result.stderr


# -- 6: ls of a root that is not there ------------------------------------------------------------


def test_ls_of_a_root_that_does_not_exist_is_no_checkpoint_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ls", str(tmp_path / "no-such-root")]) == EXIT_NOT_FOUND
    assert "nothing at" in capsys.readouterr().err


def test_ls_of_an_existing_root_without_steps_still_lists_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "steps").mkdir()
    assert main(["ls", str(tmp_path / "steps")]) == EXIT_OK
    assert "no steps under" in capsys.readouterr().out


def test_ls_of_a_file_points_to_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = saved(tmp_path)
    assert main(["ls", str(obj)]) == EXIT_CONFIGURATION
    assert f"flyte-checkpoint inspect {obj}" in capsys.readouterr().err


# -- 7: a reader that stops early ---------------------------------------------------------------


def test_inspect_json_into_a_reader_that_stops_after_one_line_exits_quietly(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for index in range(3000):  # a listing far larger than a pipe holds, so the write must fail
        (tree / f"member-{index:05d}.txt").write_bytes(b"x")
    Checkpoint(str(tmp_path / "ckpt")).save_sync(tree)
    process = subprocess.Popen(
        [str(COMMAND), "inspect", "--json", str(tmp_path / "ckpt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    assert process.stdout.readline().strip() == b"{"
    process.stdout.close()  # what `| head -1` does
    status = process.wait(timeout=120)
    stderr = process.stderr.read().decode()
    process.stderr.close()
    assert status == EXIT_OUTPUT_CLOSED == 128 + signal.SIGPIPE, stderr
    assert stderr == ""


# -- 8: a multi-part checkpoint where one object is read ----------------------------------------


@pytest.mark.parametrize(
    "argv", [["inspect"], ["verify"], ["get", "{out}"]], ids=["inspect", "verify", "get"]
)
@pytest.mark.parametrize("where", ["step", "step/", "manager", "state"])
def test_a_multi_part_checkpoint_given_where_one_object_is_read_points_to_ls(
    argv: list[str], where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = CheckpointManager(str(tmp_path / "steps"))
    manager.save(3, controller=None, parts=[Counter(1)])
    StateCheckpoint(str(tmp_path / "state")).save(controller=None, parts=[Counter(2)])
    uri = {
        "step": manager.checkpoint_dir(3),
        "step/": f"{manager.checkpoint_dir(3)}/",
        "manager": str(tmp_path / "steps"),
        "state": str(tmp_path / "state"),
    }[where]
    name, *rest = argv
    assert main([name, uri, *(part.format(out=tmp_path / "out") for part in rest)]) == EXIT_CONFIGURATION
    assert f"flyte-checkpoint ls {uri.rstrip('/')}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def option_flags(options: dict[str, Any]) -> list[str]:
    """``options`` as the command's ``-o KEY=VALUE`` flags (VALUE as JSON)."""
    return [flag for key, value in options.items() for flag in ("-o", f"{key}={json.dumps(value)}")]


def test_on_an_object_store_ls_of_nothing_is_4_and_verify_of_a_step_points_to_ls(
    s3_server: StorageServer, capsys: pytest.CaptureFixture[str]
) -> None:
    remote = remote_for("s3", s3_server)
    flags = option_flags(remote.storage_options)
    manager = CheckpointManager(remote.uri("steps"), storage_options=remote.storage_options)
    manager.save(3, controller=None, parts=[Counter(1)])
    assert main(["ls", *flags, remote.uri("no-such-root")]) == EXIT_NOT_FOUND
    assert main(["ls", *flags, remote.uri("steps")]) == EXIT_OK
    capsys.readouterr()
    assert main(["verify", *flags, manager.checkpoint_dir(3)]) == EXIT_CONFIGURATION
    assert f"flyte-checkpoint ls {manager.checkpoint_dir(3)}" in capsys.readouterr().err
    assert main(["verify", *flags, remote.uri("steps/absent")]) == EXIT_NOT_FOUND


# -- 9: a read-only file system -----------------------------------------------------------------


def in_read_only_mount(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a user and mount namespace where ``tmp_path/ro`` is a read-only tmpfs: a
    real read-only file system, without root on the host."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) for a read-only mount")
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    script = 'mount -t tmpfs -o ro none "$0" || exit 99; exec "$@"'
    result = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script, str(mount_point), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    if result.returncode == 99:
        pytest.skip(f"this machine allows no user namespace with a mount: {result.stderr.strip()}")
    return result


def test_put_onto_a_read_only_file_system_is_a_storage_failure_as_documented(tmp_path: Path) -> None:
    source = tmp_path / "state.bin"
    source.write_bytes(b"state")
    result = in_read_only_mount(tmp_path, str(COMMAND), "put", str(source), str(tmp_path / "ro" / "ckpt"))
    assert result.returncode == EXIT_STORAGE, result.stderr
    assert "CheckpointStorageError: read-only filesystem saving" in result.stderr


def test_a_save_onto_a_read_only_file_system_raises_the_documented_storage_error(tmp_path: Path) -> None:
    program = (
        "import sys\n"
        "from flyte_checkpoint import Checkpoint, CheckpointPermissionError, CheckpointStorageError\n"
        "try:\n"
        "    Checkpoint(sys.argv[1]).save_sync(b'state')\n"
        "except CheckpointStorageError as error:\n"
        "    assert not isinstance(error, CheckpointPermissionError)\n"
        "    print(type(error).__name__)\n"
    )
    result = in_read_only_mount(tmp_path, sys.executable, "-c", program, str(tmp_path / "ro" / "ckpt"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "CheckpointStorageError"


# -- 11: a trailing slash on a local destination ------------------------------------------------


@pytest.mark.parametrize("spelling", ["path", "file-uri"])
def test_put_to_a_local_location_ending_in_a_slash_is_refused_and_writes_nothing(
    spelling: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "state.bin"
    source.write_bytes(b"state")
    destination = tmp_path / "out"
    uri = f"{destination}/" if spelling == "path" else f"{destination.as_uri()}/"
    assert main(["put", str(source), uri]) == EXIT_CONFIGURATION
    assert "drop the trailing slash" in capsys.readouterr().err
    assert not destination.exists()


# -- 12: errors name their kind; help lists what each command returns ---------------------------


def test_a_json_error_names_the_kind_of_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = saved(tmp_path, os.urandom(4096))
    damage_in_place(obj, 100, b"\x00\xff")
    outcomes = [
        (["verify", "--json", str(tmp_path / "missing")], EXIT_NOT_FOUND, "not_found"),
        (["verify", "--json", str(obj)], EXIT_CORRUPT, "corrupt"),
        (["inspect", "--json", "ftp://host/ckpt"], EXIT_CONFIGURATION, "configuration"),
        (["inspect", "--json", "/dev/null"], EXIT_STORAGE, "storage"),
    ]
    for argv, code, kind in outcomes:
        assert main(argv) == code
        document = json_error(capsys)
        assert (document["exit_code"], document["error"]["kind"]) == (code, kind)


def test_a_failing_task_is_kind_task_failed_under_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--json", "--checkpoint-path", str(tmp_path / "c"), "json:dumps", "--inputs", '{"bad": 1}']
    assert main(argv) == EXIT_TASK_FAILED
    document = json_error(capsys)
    assert (document["error"]["kind"], document["error"]["type"]) == ("task_failed", "TypeError")


def statuses_in_help(*argv: str) -> set[str]:
    text = command(*argv, "--help").stdout
    listed = text.partition("exit status:")[2]
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


@pytest.mark.parametrize("name", ["inspect", "verify", "get", "put", "ls", "run"])
def test_each_subcommand_help_lists_only_the_exit_statuses_it_can_return(name: str) -> None:
    expected = {str(entry.code) for entry in EXIT_CODES if name in entry.commands}
    assert statuses_in_help(name) == expected


def test_only_run_help_lists_the_preemption_statuses() -> None:
    assert {"75", "128+N"} <= statuses_in_help("run")
    for name in ["inspect", "verify", "get", "put", "ls"]:
        assert not {"75", "128+N"} & statuses_in_help(name)
    assert not {"4", "5", "6", "7", "8"} & statuses_in_help("run")


def test_the_documented_table_of_exit_statuses_is_the_code_s() -> None:
    guide = (REPO / "docs" / "guides" / "command.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| `([a-z_]+)` \| (.+?) \| (.+?) \|$", guide, flags=re.MULTILINE)
    every = ("inspect", "verify", "get", "put", "ls", "run")
    documented = [
        (code, kind, every if commands == "all" else tuple(commands.replace("`", "").split(", ")))
        for code, kind, _, commands in rows
    ]
    expected = [(str(entry.code), entry.kind, entry.commands) for entry in EXIT_CODES]
    assert documented == expected
