"""Structure facts of the ``fadat`` package: import circles, library modules that import the CLI
layer, file sizes and the longest functions.

    python scripts/structure.py                 # the working tree
    python scripts/structure.py --rev 3b44b19   # any commit (files read with ``git show``)

The import graph counts every ``import``/``from … import`` of a ``fadat`` module, at module level,
inside a function (a deferred import is still a dependency) or under ``if TYPE_CHECKING:`` (never
run, but a type named in a signature is a design dependency all the same; the circles are also
reported without these, as "at run time"). ``fadat.cli`` is the CLI layer: the argument parser,
the exit codes and the verb modules of the ``fadat.cli`` package. Exits with 1 when there is an
import circle, a library module (one outside ``fadat.cli``) imports ``fadat.cli`` or one of its
modules, or a library module other than the option table (:data:`ARGPARSE_ALLOWED`) imports
``argparse`` (the command line is a layer: the library takes keyword arguments), else 0
(``tests/test_structure.py`` runs it).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = "fadat.cli"
#: library modules allowed to import ``argparse`` besides ``fadat.cli``'s: the option table
#: (its value types raise ``argparse.ArgumentTypeError``, which argparse prints as given).
ARGPARSE_ALLOWED = frozenset({"fadat.options"})


def read_sources(rev: str | None) -> dict[str, str]:
    """``{module name: source text}`` of every ``fadat/**/*.py`` at ``rev`` (None: working tree)."""
    if rev is None:
        files = sorted((ROOT / "fadat").rglob("*.py"))
        return {_module(f.relative_to(ROOT).as_posix()): f.read_text() for f in files}
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "fadat"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    out = {}
    for path in sorted(p for p in listing if p.endswith(".py")):
        text = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        out[_module(path)] = text
    return out


def _module(path: str) -> str:
    name = path[: -len(".py")].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def imports(module: str, tree: ast.Module, known: set[str], type_only: bool = True) -> set[str]:
    """The ``fadat`` modules ``module`` imports (``from fadat import dag`` counts as fadat.dag);
    with ``type_only=False`` without those under ``if TYPE_CHECKING:``."""
    found = set()
    package = module if module in known and _is_package(module, known) else module.rsplit(".", 1)[0]
    for node in ast.walk(tree) if type_only else _walk_runtime(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != module and name.startswith("fadat"):
                found.add(name)
    # `import fadat.x` also runs fadat/__init__; that edge is not a design dependency.
    found.discard("fadat")
    return found


def _walk_runtime(tree: ast.AST):
    """``ast.walk`` without the bodies of ``if TYPE_CHECKING:`` (imports for type checkers only,
    never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = getattr(child, "test", None) if isinstance(child, ast.If) else None
            if test is not None and "TYPE_CHECKING" in ast.unparse(test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _is_package(module: str, known: set[str]) -> bool:
    return any(other.startswith(module + ".") for other in known)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def functions(module: str, tree: ast.Module) -> list[tuple[int, str]]:
    """``(lines, qualified name)`` of every function, method and class in the module."""
    out = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                out.append((child.end_lineno - child.lineno + 1, f"{module}.{name}"))
                walk(child, name + ".")

    walk(tree, "")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default=None, help="git revision (default: the working tree)")
    parser.add_argument("--top", type=int, default=12, help="longest functions to list (12)")
    args = parser.parse_args(argv)
    sources = read_sources(args.rev)
    known = set(sources)
    trees = {m: ast.parse(text) for m, text in sources.items()}
    graph = {m: imports(m, tree, known) for m, tree in trees.items()}
    found = circles(graph)
    runtime = circles({m: imports(m, tree, known, type_only=False) for m, tree in trees.items()})
    cli_users = sorted(
        m for m, deps in graph.items() if not _in_cli(m) and any(_in_cli(d) for d in deps)
    )

    print(f"fadat at {args.rev or 'the working tree'}: {len(sources)} modules")
    print(f"import circles: {len(found)} (type-only imports included; {len(runtime)} at run time)")
    for component in found:
        print("  " + " <-> ".join(component))
    print(f"library modules importing {CLI}: {len(cli_users)}")
    for m in cli_users:
        print(f"  {m}")
    parsers = argparse_users(trees)
    print(
        f"library modules importing argparse (outside {CLI} and the option table): {len(parsers)}"
    )
    for m in parsers:
        print(f"  {m}")
    sizes = sorted(((len(t.splitlines()), m) for m, t in sources.items()), reverse=True)
    total = sum(n for n, _ in sizes)
    print(f"\nlines per module (total {total}; > 600: {sum(n > 600 for n, _ in sizes)}):")
    for n, m in sizes:
        print(f"  {n:5d}  {m}")
    defs = sorted((d for m, tree in trees.items() for d in functions(m, tree)), reverse=True)
    print(f"\nlongest functions and methods (lines, classes excluded), top {args.top}:")
    plain = [d for d in defs if not _is_class(d[1], trees)]
    for n, name in plain[: args.top]:
        print(f"  {n:5d}  {name}")
    print(f"\nlongest classes, top {min(args.top, 5)}:")
    for n, name in [d for d in defs if _is_class(d[1], trees)][:5]:
        print(f"  {n:5d}  {name}")
    return 1 if found or cli_users or parsers else 0


def argparse_users(trees: dict[str, ast.Module]) -> list[str]:
    """Library modules (outside ``fadat.cli`` and :data:`ARGPARSE_ALLOWED`) with an ``import
    argparse`` or ``from argparse import …`` anywhere: module level, in a function or under
    ``if TYPE_CHECKING:`` (a ``Namespace`` in a signature is a dependency on the command line)."""
    found = []
    for module, tree in sorted(trees.items()):
        if _in_cli(module) or module in ARGPARSE_ALLOWED:
            continue
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            if any(n == "argparse" or n.startswith("argparse.") for n in names):
                found.append(module)
                break
    return found


def _in_cli(module: str) -> bool:
    return module == CLI or module.startswith(CLI + ".")


def _is_class(qualified: str, trees: dict[str, ast.Module]) -> bool:
    module = max((m for m in trees if qualified.startswith(m + ".")), key=len)
    parts = qualified[len(module) + 1 :].split(".")
    nodes: list[ast.AST] = [trees[module]]
    node: ast.AST | None = None
    for part in parts:
        node = next(
            c
            for parent in nodes
            for c in ast.iter_child_nodes(parent)
            if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and c.name == part
        )
        nodes = [node]
    return isinstance(node, ast.ClassDef)


if __name__ == "__main__":
    sys.exit(main())
