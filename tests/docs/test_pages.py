"""What a new user reads first says what is true: the comparison with the SDK's own helper
quotes measured figures, and the install commands work for a package no registry has."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.blocks import DOCS, ROOT

README = ROOT / "README.md"
HOME = DOCS / "index.md"
# Where the repository's measurements are written up; a figure in the comparison must be one of
# theirs, so it cannot be made up, nor drift from the runs it quotes.
MEASUREMENTS = (DOCS / "performance.md", DOCS / "reliability.md", ROOT / "benchmarks" / "README.md")
COMPARISON = "## Why not flyte-sdk's own `flyte.Checkpoint`"
NUMBER = re.compile(r"\d+(?:\.\d+)*")


def comparison_table(page: Path) -> str:
    """The table under the comparison heading of ``page``."""
    text = page.read_text()
    assert COMPARISON in text, f"{page.name} has no section {COMPARISON!r}"
    section = text.split(COMPARISON, 1)[1]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def test_the_readme_and_the_home_page_show_the_same_comparison_with_the_sdk() -> None:
    table = comparison_table(HOME)
    assert table == comparison_table(README)
    rows = {line.split("|")[1].strip() for line in table.splitlines()[2:]}
    for subject in (
        "Speed",
        "Silent fresh starts",
        "Corruption",
        "Background saves",
        "Preemption",
        "Command line",
        "Format compatibility",
    ):
        assert any(row.startswith(f"**{subject}**") for row in rows), f"no row on {subject}"


def test_every_figure_in_the_comparison_is_a_measured_one() -> None:
    measured = set(NUMBER.findall("".join(path.read_text() for path in MEASUREMENTS)))
    quoted = set(NUMBER.findall(comparison_table(HOME)))
    assert quoted - {"0"}, "the comparison quotes no figure"
    assert quoted <= measured, f"figures no measurement gives: {sorted(quoted - measured)}"


def _texts_a_user_reads() -> list[Path]:
    """The pages, the examples' docstrings and the package's own (the reference, its messages)."""
    return [
        README,
        *sorted(DOCS.rglob("*.md")),
        *sorted((ROOT / "examples").rglob("*.py")),
        *sorted((ROOT / "flyte_checkpoint").rglob("*.py")),
    ]


def test_no_install_command_names_a_package_no_registry_has() -> None:
    # The package is installed from a checkout (`pip install '.[s3]'`) or a wheel built there:
    # `pip install 'flyte-checkpoint[s3]'` fails for every new user.
    unreachable = re.compile(r"pip install '?flyte-checkpoint\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _texts_a_user_reads()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if unreachable.search(line)
    ]
    assert not found, f"install commands that cannot work: {found}"


def test_get_started_installs_the_wheel_this_version_builds() -> None:
    # Read with a pattern: tomllib is no module on Python 3.10, which the package supports.
    found = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert found, "pyproject.toml names no version"
    version = found.group(1)
    text = (DOCS / "get-started.md").read_text()
    assert "pip install '.[s3]'" in text
    assert f"pip install 'dist/flyte_checkpoint-{version}-py3-none-any.whl[s3]'" in text


PREEMPTION = DOCS / "guides" / "preemption.md"
FENCED = re.compile(r"^(`{3,})([\w-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.DOTALL | re.MULTILINE)


def sections(page: Path) -> dict[str, str]:
    """``page``'s prose by heading (its code blocks left out), the text before the first under ``""``."""
    found: dict[str, str] = {}
    heading = ""
    for line in FENCED.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            found[heading] = ""
        else:
            found[heading] = found.get(heading, "") + line + "\n"
    return found


def test_the_preemption_guide_is_in_sections_a_reader_can_find() -> None:
    # It was one bullet list of 736 words under the title, with an empty table of contents.
    text = PREEMPTION.read_text()
    assert len(re.findall(r"^## ", text, re.MULTILINE)) >= 4
    long = {heading: len(prose.split()) for heading, prose in sections(PREEMPTION).items()}
    assert max(long.values()) <= 400, f"sections over 400 words: {long}"


def test_the_preemption_guide_draws_the_timeline_from_notice_to_sigkill() -> None:
    drawings = [code for _, language, code in FENCED.findall(PREEMPTION.read_text()) if language == "text"]
    assert drawings, "no timeline drawn"
    timeline = drawings[0]
    marks = [timeline.find(mark) for mark in ("SIGTERM", "the final save", "commit", "exit", "margin")]
    assert -1 not in marks, timeline
    assert "SIGKILL" in timeline.splitlines()[0], "the SIGKILL ends the timeline's first line"


def test_the_preemption_guide_says_what_each_runner_does_after_a_preemption() -> None:
    rows = [
        line for line in sections(PREEMPTION)["What each runner does"].splitlines() if line.startswith("| ")
    ]
    runners = " ".join(row.split("|")[1] for row in rows)
    for runner in (
        "run_with_retries",
        "load_and_run_task",
        "flyte-checkpoint run",
        "on a cluster",
        "local mode",
        "DistributedCheckpointManager",
    ):
        assert runner in runners, f"no row for {runner}"


def _python_code() -> str:
    return "\n".join(code for page in (README, *DOCS.rglob("*.md")) for code in _python_blocks(page))


def _python_blocks(page: Path) -> list[str]:
    return [code for _, language, code in FENCED.findall(page.read_text()) if language == "python"]


def test_every_lightning_trainer_shown_says_how_long_it_trains() -> None:
    # Lightning's default is 1000 epochs: a snippet copied as written trains for hours.
    trainers = re.findall(r"\bL\.Trainer\((.*?)\)\s*(?:#.*)?$", _python_code(), re.MULTILINE)
    assert trainers, "no Trainer shown: has the Lightning snippet moved?"
    assert all("max_epochs=" in call or "max_steps=" in call for call in trainers), trainers


def test_every_local_flyte_run_shown_says_where_its_data_goes() -> None:
    # Without raw_data_path the SDK's local mode writes under /tmp/flyte/raw_data, which every
    # local run of the machine shares.
    runs = re.findall(r"with_runcontext\((.*?)\)", _python_code())
    assert runs, "no local Flyte run shown: has the snippet moved?"
    assert all("raw_data_path=" in arguments for arguments in runs if "local" in arguments), runs


def test_the_dcp_guide_names_the_extra_it_needs() -> None:
    assert "pip install '.[torch" in (DOCS / "guides" / "multi-node-dcp.md").read_text()


def test_get_started_sends_ray_and_dcp_readers_to_their_own_guides() -> None:
    install = sections(DOCS / "get-started.md")["Install"]
    assert "(guides/ray.md)" in install
    assert "(guides/multi-node-dcp.md)" in install


PLACEHOLDER = re.compile(r'"\.\.\."|"/path/to/key\.json"|http://127\.0\.0\.1:9000')
FENCE_INFO = re.compile(r"^(`{3,})python([^\n]*)\n(.*?)^\1[ \t]*$", re.DOTALL | re.MULTILINE)


def test_a_python_block_that_cannot_run_as_written_says_so_on_the_page() -> None:
    # A reader copies a block as shown: one holding placeholders (a key "...", a key file) fails
    # until they are filled in, and its title says so where the code is.
    unmarked = [
        f"{page.relative_to(ROOT)}: {code.splitlines()[0]}"
        for page in (README, *sorted(DOCS.rglob("*.md")))
        for _, info, code in FENCE_INFO.findall(page.read_text())
        if PLACEHOLDER.search(code) and not re.search(r'title="[^"]*\byour\b', info, re.IGNORECASE)
    ]
    assert not unmarked, f"blocks with placeholders and no title saying so: {unmarked}"
