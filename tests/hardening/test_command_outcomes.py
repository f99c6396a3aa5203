"""The command: one exit code per kind of outcome across every subcommand, errors as JSON under
--json, --version, and task modules imported from the current directory as python -m does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, __version__
from flyte_checkpoint.cli import (
    EXIT_CODES,
    EXIT_CONFIGURATION,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TASK_FAILED,
    main,
)

COMMAND = Path(sys.executable).with_name("flyte-checkpoint")


def command(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(COMMAND), *argv], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{missing}"],
        ["verify", "{missing}"],
        ["get", "{missing}", "{out}"],
        ["put", "{missing}", "{obj}"],
    ],
    ids=["inspect", "verify", "get", "put"],
)
def test_nothing_there_is_the_same_exit_code_for_every_command(argv: list[str], tmp_path: Path) -> None:
    names = {"missing": str(tmp_path / "missing"), "out": str(tmp_path / "out"), "obj": str(tmp_path / "obj")}
    assert main([part.format(**names) for part in argv]) == EXIT_NOT_FOUND


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "ftp://host/ckpt"],
        ["verify", "ftp://host/ckpt"],
        ["get", "ftp://host/ckpt", "{out}"],
        ["put", "{source}", "ftp://host/ckpt"],
        ["ls", "ftp://host/steps"],
        ["run", "--checkpoint-path", "ftp://host/ckpt", "json:dumps"],
    ],
    ids=["inspect", "verify", "get", "put", "ls", "run"],
)
def test_an_unsupported_scheme_is_the_same_configuration_exit_code_for_every_command(
    argv: list[str], tmp_path: Path
) -> None:
    source = tmp_path / "state.bin"
    source.write_bytes(b"x")
    names = {"out": str(tmp_path / "out"), "source": str(source)}
    assert main([part.format(**names) for part in argv]) == EXIT_CONFIGURATION


def test_a_task_that_fails_and_a_task_reference_that_does_not_import_get_different_codes(
    tmp_path: Path,
) -> None:
    checkpoint = ["run", "--checkpoint-path", str(tmp_path / "ckpt")]
    assert main([*checkpoint, "--inputs", '{"bad": 1}', "json:dumps"]) == EXIT_TASK_FAILED
    assert main([*checkpoint, "no_such_module_here:task"]) == EXIT_CONFIGURATION


def test_errors_are_one_json_object_under_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--json", str(tmp_path / "missing")]) == EXIT_NOT_FOUND
    document = json.loads(capsys.readouterr().out)
    assert document["exit_code"] == EXIT_NOT_FOUND
    assert document["error"]["type"] == "CheckpointNotFoundError"
    assert "no checkpoint at" in document["error"]["message"]


def test_verify_get_and_put_speak_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "state.bin"
    source.write_bytes(b"state")
    assert main(["put", "--json", str(source), str(tmp_path / "ckpt")]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["uri"] == str(tmp_path / "ckpt")
    assert main(["verify", "--json", str(tmp_path / "ckpt")]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["verified"] is True
    assert main(["get", "--json", str(tmp_path / "ckpt"), str(tmp_path / "out")]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["restored"] == str(tmp_path / "out" / "payload")


def test_version_prints_the_package_version() -> None:
    result = command("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"flyte-checkpoint {__version__}"


def test_help_lists_every_exit_code() -> None:
    described = " ".join(command("--help").stdout.split())
    for entry in EXIT_CODES:
        assert f"{entry.code} {entry.meaning}" in described


def test_run_imports_a_task_module_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "my_training.py").write_text("def train(n: int) -> int:\n    return n * 2\n")
    result = command(
        "run",
        "--checkpoint-path",
        str(tmp_path / "ckpt"),
        "my_training:train",
        "--inputs",
        '{"n": 21}',
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "42"
    Checkpoint(tmp_path / "unused")  # the package still imports normally beside the task module
