"""Everything the documentation shows is run: every ``python`` block is executed (against the
test suite's local S3, GCS and Azure servers where it names a store) and type-checked with
``mypy --strict``, every shell block not marked illustrative is run, and the site builds with
``mkdocs build --strict``. The conventions are in ``docs/how-it-works/docs-tests.md``."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.blocks import (
    ILLUSTRATIVE,
    ROOT,
    Block,
    Program,
    console_commands,
    programs,
    shell_blocks,
)
from tests.storage_servers import StorageServer, create_bucket

PROGRAMS = programs()
SHELL_BLOCKS = [block for block in shell_blocks() if block.marker != ILLUSTRATIVE]
# A store's URI in a block (`s3://bucket/...`): the bucket is replaced by a fresh one on the local
# server and the key put under the program's own prefix.
STORE_URI = re.compile(r"\b(s3|gs|abfs)://(bucket|container)/")
# `"KEY": "..."` in a block is a value the reader fills in: the local server's value for KEY.
FILL_IN = re.compile(r'"(\w+)": "\.\.\."')
# Literal placeholders and what they stand for here.
PLACEHOLDERS = {
    "http://127.0.0.1:9000": "s3 endpoint",  # an S3-compatible server's endpoint
    '"/path/to/key.json"': '"anon"',  # a GCS service-account key file
}
BIN = Path(sys.executable).parent


def _timeout_env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def servers(
    s3_server: StorageServer, gcs_server: StorageServer, azure_server: StorageServer
) -> dict[str, tuple[StorageServer, str]]:
    """Each store's server and a fresh bucket on it."""
    started = (s3_server, gcs_server, azure_server)
    return {server.protocol: (server, create_bucket(server, "docs")) for server in started}


def substituted(code: str, program: Program, servers: dict[str, tuple[StorageServer, str]]) -> str:
    """``code`` with its placeholders replaced by what reaches the local servers."""
    code = STORE_URI.sub(lambda m: f"{m.group(1)}://{servers[m.group(1)][1]}/{program.module}/", code)
    filled = {
        key: value
        for protocol in ("abfs", "gs", "s3")
        for key, value in servers[protocol][0].storage_options.items()
    }

    def fill(match: re.Match[str]) -> str:
        return f'"{match.group(1)}": {json.dumps(filled[match.group(1)])}'

    code = FILL_IN.sub(fill, code)
    for placeholder, value in PLACEHOLDERS.items():
        code = code.replace(placeholder, servers["s3"][0].endpoint if value == "s3 endpoint" else value)
    return code


class Job:
    """A command running in the background, its output in files (no pipe to fill up)."""

    def __init__(self, name: str, command: list[str], folder: Path, env: dict[str, str]) -> None:
        self.out, self.err = folder / f"{name}.out", folder / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err)

    def finish(self, timeout: float = 240) -> tuple[int, str, str]:
        """Wait for the command (killed at ``timeout``); its exit status, stdout and stderr."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return (
            self.process.returncode,
            self.out.read_text(errors="replace"),
            self.err.read_text(errors="replace"),
        )


@pytest.fixture(scope="module")
def background(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Job, Path]]]:
    """The type check of the programs and the site build, started at once to run beside the
    programs (each mostly waits on a different thing); each job with its folder."""
    types = tmp_path_factory.mktemp("doc-types")
    files = []
    for program in PROGRAMS:
        path = types / f"{program.module}.py"
        path.write_text("\n".join(program.parts))
        files.append(str(path))
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, **_timeout_env(), "NO_MKDOCS_2_WARNING": "1"}
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--strict", *files]
    # No --quiet: it hides the warnings from the count that --strict fails on.
    mkdocs = [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(site)]
    jobs = {"mypy": (Job("mypy", mypy, types, env), types), "site": (Job("mkdocs", mkdocs, types, env), site)}
    yield jobs
    for job, _ in jobs.values():
        job.finish(timeout=0.1)
    shutil.rmtree(site, ignore_errors=True)


# Programs that start Ray run in a runner of their own, beside the others: Ray's start is mostly
# waiting for its processes, so the two overlap even on two cores, and no Ray state is left in
# the process that runs everything else.
OWN_RUNNER = re.compile(r"^(import|from) ray\b", re.MULTILINE)


@pytest.fixture(scope="module")
def outcomes(
    background: dict[str, tuple[Job, Path]],
    servers: dict[str, tuple[StorageServer, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str | None]:
    """Runs every program once, with the servers' environment variables set as a user would set
    them; the name of each program and its traceback (``None``: it ran)."""
    work = tmp_path_factory.mktemp("doc-programs")
    groups: dict[str, list[dict[str, object]]] = {"main": [], "ray": []}
    for program in PROGRAMS:
        cwd = work / program.module
        cwd.mkdir()
        parts = [substituted(part, program, servers) for part in program.parts]
        group = "ray" if any(OWN_RUNNER.search(part) for part in parts) else "main"
        groups[group].append({"name": program.name, "parts": parts, "cwd": str(cwd)})
    env = {**os.environ, **_timeout_env()}
    for server, _ in servers.values():
        env.update(server.env)
    runners = {}
    for group, listed in groups.items():
        (work / f"{group}.json").write_text(json.dumps(listed))
        command = [
            sys.executable,
            str(ROOT / "tests" / "docs" / "runner.py"),
            f"{group}.json",
            f"{group}.out",
        ]
        # stderr to a file: a pipe left unread while the other runner is awaited could fill up.
        with open(work / f"{group}.err", "wb") as errors:
            runners[group] = subprocess.Popen(
                command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=errors
            )
    outcome: dict[str, str | None] = {}
    stopped = []
    for group, runner in runners.items():
        try:
            runner.wait(timeout=240)
        except subprocess.TimeoutExpired:
            runner.kill()
            runner.wait()
        results = work / f"{group}.out"
        for line in results.read_text().splitlines() if results.exists() else []:
            record = json.loads(line)
            outcome[record["name"]] = record["error"]
        stderr = (work / f"{group}.err").read_text(errors="replace")
        stopped.append(f"the {group} runner exited {runner.returncode}:\n{stderr[-4000:]}")
    # Read only when a program is missing: the one after the last recorded ended its runner.
    outcome["(process)"] = "\n".join(stopped)
    return outcome


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda program: program.name)
def test_every_python_block_runs(program: Program, outcomes: dict[str, str | None]) -> None:
    assert program.name in outcomes, (
        f"{program.name} was not run (the runner stopped before it): {outcomes.get('(process)')}"
    )
    assert outcomes[program.name] is None, f"{program.name} raised:\n{outcomes[program.name]}"


@pytest.fixture(scope="module")
def mypy_errors(background: dict[str, tuple[Job, Path]]) -> dict[str, list[str]]:
    """One ``mypy --strict`` run over every program written as a file; each module's errors."""
    status, stdout, stderr = background["mypy"][0].finish()
    assert status in (0, 1), f"mypy failed to run:\n{stdout}\n{stderr}"
    errors: dict[str, list[str]] = {program.module: [] for program in PROGRAMS}
    for line in stdout.splitlines():
        stem = Path(line.partition(":")[0]).stem
        if stem in errors and ": error:" in line:
            errors[stem].append(line)
    return errors


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda program: program.name)
def test_every_python_block_type_checks(program: Program, mypy_errors: dict[str, list[str]]) -> None:
    assert not mypy_errors[program.module], "\n".join([program.name, *mypy_errors[program.module]])


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda block: block.name)
def test_every_shell_block_runs(block: Block, tmp_path: Path) -> None:
    env = {**os.environ, **_timeout_env()}

    def bash(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", *arguments],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    if block.language != "console":
        result = bash("-euo", "pipefail", "-c", block.code)
        assert result.returncode == 0, f"{block.name}:\n{result.stdout}\n{result.stderr}"
        return
    for command, shown in console_commands(block):
        result = bash("-o", "pipefail", "-c", command)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{block.name}: $ {command}\n{output}"
        for line in shown:
            first_word = line.split()[0]
            assert first_word in output, f"{block.name}: $ {command} printed no {first_word!r}:\n{output}"


def test_shell_blocks_are_run_or_marked_illustrative() -> None:
    # Guards the convention itself: a typo in the marker would silently run an illustrative block.
    marked = [block for block in shell_blocks() if block.marker == ILLUSTRATIVE]
    assert marked, "no shell block is marked illustrative: has the marker changed?"


@pytest.fixture(scope="module")
def site(background: dict[str, tuple[Job, Path]]) -> Path:
    """The site built with ``mkdocs build --strict`` (a warning, a broken link or anchor fails it)."""
    job, target = background["site"]
    status, stdout, stderr = job.finish()
    assert status == 0, f"mkdocs build --strict failed:\n{stdout}\n{stderr}"
    return target


PUBLIC_MODULES = (
    "flyte_checkpoint",
    "flyte_checkpoint.state",
    "flyte_checkpoint.distributed",
    "flyte_checkpoint.integrations.flyte",
    "flyte_checkpoint.integrations.lightning",
    "flyte_checkpoint.integrations.transformers",
)


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()


def exported_names(module: str) -> dict[str, str]:
    """``module``'s ``__all__``, each name with the module it is imported from (``module`` itself
    when defined there), read from the source: importing the integrations would import
    Lightning and transformers, seconds of the time budget."""
    path = ROOT / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(source.read_text())
    origins: dict[str, str] = {}
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            origins.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
                assert node.value is not None
                exported = list(ast.literal_eval(node.value))
    return {name: origins.get(name, module) for name in exported}


def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    pages = "".join(page.read_text() for page in (site / "reference").rglob("*.html"))
    missing = []
    for module in PUBLIC_MODULES:
        for name, defined_in in exported_names(module).items():
            # An entry under the exported name, or under the defining module's where the exported
            # name is also a submodule's (`flyte_checkpoint.state.commit`).
            ids = (f'id="{module}.{name}"', f'id="{defined_in}.{name}"')
            if not any(anchor in pages for anchor in ids):
                missing.append(f"{module}.{name}")
    assert not missing, f"no reference entry for {missing}"


def test_every_public_name_has_a_docstring_for_its_reference_entry() -> None:
    # Read as the reference reads them (griffe, from the source), so attribute docstrings count.
    import griffe

    package = griffe.load("flyte_checkpoint", search_paths=[str(ROOT)], resolve_aliases=True)
    undocumented = []
    for module in PUBLIC_MODULES:
        loaded = (
            package if module == "flyte_checkpoint" else package[module.removeprefix("flyte_checkpoint.")]
        )
        for name in exported_names(module):
            docstring = loaded[name].docstring
            if docstring is None or not docstring.value.strip():
                undocumented.append(f"{module}.{name}")
    assert not undocumented, f"no docstring: {undocumented}"


def test_the_storage_options_table_lists_what_the_error_accepts(site: Path) -> None:
    from flyte_checkpoint.storage.options import accepted_options

    page = (site / "reference" / "storage-options" / "index.html").read_text()
    page = re.sub(r'</?span( class="fc-word")?>', "", page)  # the spans keeping each word whole
    # The first cell of each row: the option's name.
    listed = set(re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>", page))
    accepted = {name for scheme in ("s3", "gs", "abfs") for name in accepted_options(scheme)}
    assert listed == accepted, f"only in the table: {listed - accepted}; missing: {accepted - listed}"


def test_every_relative_link_in_the_readme_names_a_file() -> None:
    # mkdocs checks the links between pages; the README is no page of the site, and its links
    # must work on a code host, which shows the Markdown files themselves.
    text = (ROOT / "README.md").read_text()
    targets = [target for target in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in target]
    assert targets, "the README links to no page"
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_searching_preempted_shows_the_preemption_guide_first(site: Path) -> None:
    # A reader typing `preempted` met reference entries (`Checkpoint.preempted`, `preempted_at`)
    # first: the guide had the word in no heading. The site is searched in Chromium, as a reader
    # searches it (Material's search runs in the page).
    shown = subprocess.run(
        ["node", str(ROOT / "tests" / "docs" / "search_site.js"), str(site), "preempted"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    pages = shown.stdout.split()
    assert pages, "no result"
    assert pages[0] == "/guides/preemption/", pages[:5]


def test_the_site_publishes_no_source_of_its_hooks(site: Path) -> None:
    # docs/hooks/*.py are MkDocs hooks: under docs_dir, they were copied to the site as files.
    assert not sorted(site.rglob("*.py"))
