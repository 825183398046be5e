"""Structure facts of the package (scripts/structure.py): no import circles, no library module
importing the CLI layer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "structure.py"


def _load():
    spec = importlib.util.spec_from_file_location("structure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_circles_and_no_cli_imports(capsys):
    structure = _load()
    assert structure.main([]) == 0
    out = capsys.readouterr().out
    assert "import circles: 0 (type-only imports included; 0 at run time)" in out
    assert "importing fadat.cli: 0" in out
    assert "importing argparse (outside fadat.cli and the option table): 0" in out


def test_argparse_rule_finds_every_form_of_import():
    """``import argparse``, ``from argparse import Namespace``, a deferred import and one under
    ``if TYPE_CHECKING:`` all break the rule outside the command-line layer; inside
    ``fadat.cli`` and in the option table they do not."""
    import ast

    structure = _load()
    sources = {
        "fadat.a": "import argparse\n",
        "fadat.b": "from argparse import Namespace\n",
        "fadat.c": "def f():\n    import argparse.x\n",
        "fadat.d": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import argparse\n",
        "fadat.e": "import argparsex\nfrom .argparse import y\n",
        "fadat.cli.verb": "import argparse\n",
        "fadat.options": "import argparse\n",
    }
    trees = {m: ast.parse(t) for m, t in sources.items()}
    assert structure.argparse_users(trees) == ["fadat.a", "fadat.b", "fadat.c", "fadat.d"]


def test_circle_finder_finds_a_circle():
    structure = _load()
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert structure.circles(graph) == [["a", "b", "c"]]
    assert structure.circles({"a": {"b"}, "b": set()}) == []


def test_import_fadat_leaves_the_process_alone():
    """`import fadat` (and its modules) sets no environment variable and no malloc option; the
    command line opts in through fadat.process.tune_memory."""
    import subprocess
    import sys

    code = (
        "import os; os.environ.pop('THP_MEM_ALLOC_ENABLE', None); "
        "import fadat, fadat.translation.pipeline, fadat.training.trainer; "
        "print(os.environ.get('THP_MEM_ALLOC_ENABLE')); "
        "from fadat.process import tune_memory; print(tune_memory()['huge_pages'])"
    )
    root = SCRIPT.parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True
    ).stdout.split()
    assert out == ["None", "True"]


def test_type_only_imports_count_as_edges():
    """An import under ``if TYPE_CHECKING:`` is an edge of the graph (a circle through it is a
    circle), and only that edge is dropped with ``type_only=False``."""
    import ast

    structure = _load()
    known = {"fadat.a", "fadat.b", "fadat.c"}
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from fadat import c\n"
        "if TYPE_CHECKING:\n"
        "    from fadat.b import Thing\n"
        "else:\n"
        "    pass\n"
    )
    assert structure.imports("fadat.a", tree, known) == {"fadat.b", "fadat.c"}
    assert structure.imports("fadat.a", tree, known, type_only=False) == {"fadat.c"}
    graph = {"fadat.a": structure.imports("fadat.a", tree, known), "fadat.b": {"fadat.a"}}
    assert structure.circles(graph) == [["fadat.a", "fadat.b"]]


def test_cited_docs_pages_and_sections_exist():
    """Every ``docs/PAGE.md`` a library docstring cites exists, and every section it names
    (``docs/PAGE.md, "Section"``) is a heading of that page."""
    import re

    root = SCRIPT.parent.parent
    cite = re.compile(r'docs/([\w-]+\.md)(?:[,;]?\s*\(?"([^"]+)")?')
    missing = []
    for path in sorted((root / "fadat").rglob("*.py")):
        for page, section in cite.findall(path.read_text()):
            doc = root / "docs" / page
            if not doc.is_file():
                missing.append(f"{path.name}: docs/{page}")
            elif section:
                headings = {
                    line.lstrip("#").strip()
                    for line in doc.read_text().splitlines()
                    if line.startswith("#")
                }
                section = " ".join(section.split())  # a name may wrap in a docstring
                if section not in headings:
                    missing.append(f'{path.name}: docs/{page}, "{section}"')
    assert not missing
