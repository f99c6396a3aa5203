"""``scripts/check-docs-browser`` loads a built MkDocs site in headless Chromium and finds what a
reader would meet: console errors, missing assets, links to missing pages or ids.

The site is a small one built here with MkDocs and Material, the project's docs toolchain; one
copy of it is left clean, another gets one defect of each kind on one page.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check-docs-browser"

CONFIG = """\
site_name: Browser check
theme:
  name: material
  font: false
nav:
  - Home: index.md
  - Guides:
      - First steps: guides/first.md
  - Reference:
      - API: reference/api.md
"""
PAGES = {
    "index.md": "# Home\n\nSee [the guide](guides/first.md#setup) and [below](#more).\n\n## More\n\nText.\n",
    "guides/first.md": "# First steps\n\n## Setup\n\nBack [home](../index.md).\n",
    "reference/api.md": "# API\n\n## Names\n\nSee [names](#names).\n",
}
DEFECTS = (
    '<a href="#nowhere">to nowhere</a>'
    '<a href="../no-such-page/">to no page</a>'
    '<img src="missing.png" alt="">'
    '<script>console.error("an error from the page")</script>'
    # A code line far wider than the column at 1280 px, and one inline token longer than a line,
    # which the theme breaks inside (it lets inline code break anywhere).
    f"<pre><code>{'x = 1  # ' + 'a long comment ' * 20}</code></pre>"
    f"<p><code>{'CheckpointCorruptError' * 8}</code></p>"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("docs-source")
    (source / "mkdocs.yml").write_text(CONFIG)
    for name, text in PAGES.items():
        (source / "docs" / name).parent.mkdir(parents=True, exist_ok=True)
        (source / "docs" / name).write_text(text)
    built = tmp_path_factory.mktemp("docs-site") / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(built)],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return built


def _check(site: Path, screenshots: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), str(site), "--screenshots", str(screenshots)],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def clean_run(
    site: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    screenshots = tmp_path_factory.mktemp("screenshots")
    return _check(site, screenshots), screenshots


@pytest.fixture(scope="module")
def broken_run(site: Path, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    broken = tmp_path_factory.mktemp("broken") / "site"
    shutil.copytree(site, broken)
    page = broken / "guides" / "first" / "index.html"
    html = page.read_text()
    assert "</article>" in html, "Material's page layout changed: put the defects elsewhere"
    page.write_text(html.replace("</article>", DEFECTS + "</article>", 1))
    return _check(broken, tmp_path_factory.mktemp("broken-screenshots"))


def test_a_clean_site_passes(clean_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, _ = clean_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "pages: 4 passed, 0 failed"


def test_the_home_page_a_guide_and_a_reference_page_are_screenshotted(
    clean_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, screenshots = clean_run
    shots = sorted(path.name for path in screenshots.iterdir())
    assert shots == ["guides-first.png", "home.png", "reference-api.png"]
    assert all((screenshots / name).read_bytes().startswith(b"\x89PNG") for name in shots)


def test_a_defect_fails_the_check_and_names_its_page(broken_run: subprocess.CompletedProcess[str]) -> None:
    assert broken_run.returncode == 1, broken_run.stdout + broken_run.stderr
    assert "FAIL guides/first/index.html" in broken_run.stdout
    assert broken_run.stdout.splitlines()[-1] == "pages: 3 passed, 1 failed"


def test_a_link_to_a_missing_id_is_reported(broken_run: subprocess.CompletedProcess[str]) -> None:
    assert 'broken link: #nowhere (no id "nowhere" on that page)' in broken_run.stdout


def test_a_link_to_a_missing_page_is_reported(broken_run: subprocess.CompletedProcess[str]) -> None:
    assert "broken link: ../no-such-page/ (no such page)" in broken_run.stdout


def test_a_missing_asset_is_reported(broken_run: subprocess.CompletedProcess[str]) -> None:
    assert "HTTP 404: http://127.0.0.1:" in broken_run.stdout
    assert "/guides/first/missing.png" in broken_run.stdout


def test_a_console_error_is_reported(broken_run: subprocess.CompletedProcess[str]) -> None:
    assert "console error: an error from the page" in broken_run.stdout


def test_a_code_line_clipped_at_the_window_width_is_reported(
    broken_run: subprocess.CompletedProcess[str],
) -> None:
    assert "code line clipped at 1280 px: 309 characters: x = 1  # a long comment" in broken_run.stdout


def test_inline_code_broken_inside_a_word_is_reported(broken_run: subprocess.CompletedProcess[str]) -> None:
    assert (
        "inline code broken inside a word: CheckpointCorruptErrorCheckpointCorruptError" in broken_run.stdout
    )
