"""The documentation site builds with warnings as errors, and no tracked Markdown file names an
absolute path of a machine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Absolute paths of a machine (a build machine's work tree, a home or root directory).
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home|Users)/")


def _tracked_markdown() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.md"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name]


def test_no_machine_paths_in_tracked_markdown():
    found = []
    for path in _tracked_markdown():
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "absolute machine paths:\n" + "\n".join(found)


def test_machine_path_pattern():
    assert MACHINE_PATH.search("see /work/runs/x")
    assert MACHINE_PATH.search("(/root/.cache)")
    assert MACHINE_PATH.search("`/home/user/data`")
    assert not MACHINE_PATH.search("runs/work/x and data/home/y")
    assert not MACHINE_PATH.search("https://example.org/work/x")


def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a broken link, a missing anchor, a page outside the nav, a
    docstring mkdocstrings cannot render or a CLI page that cannot be generated fails it."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (site / "index.html").is_file()
    # The command-line reference is generated from the parsers: every verb has its page.
    from fadat.cli import VERBS

    for verb in VERBS:
        page = site / "reference" / "cli" / verb / "index.html"
        assert page.is_file(), verb
        assert f"fadat {verb}" in page.read_text(encoding="utf-8")
    translate = (site / "reference" / "cli" / "translate" / "index.html").read_text("utf-8")
    assert "--strategy" in translate and "--precision" in translate
