"""Models that results depend on, committed in main's history but not in its working tree.

    python scripts/model_archive.py add MODEL_DIR --name NAME [--description TEXT]
    python scripts/model_archive.py restore NAME [--output DIR] [--force]
    python scripts/model_archive.py verify [NAME ...]
    python scripts/model_archive.py list

Why: every model a result, benchmark or recipe depends on is committed (fp16 weights, a model
card), but the working tree has to stay small: a clone's checkout, and the copy of it that a
lent GPU machine receives (at most 64 MiB), would otherwise grow by 15 MB a model. The released
models stay in ``models/`` as plain files; the others are archived:

``add`` makes two commits on the current branch. The first, the *model commit*, is the branch
tip plus the model's files under ``models/archive/NAME/``. The second is a merge of the tip and
the model commit whose tree is the tip's with one change: ``models/archive.json`` gains the
entry for NAME (the model commit's hash, the description, each file's size in bytes and
SHA-256). The model's files are then reachable from the branch, so every clone of it holds them
(a shallow clone does not: ``git fetch --unshallow`` first), yet they are not in its checkout.
The model directory must hold ``model.safetensors`` (every floating-point tensor fp16, at most
``--max-bytes``, 20 MB by default), ``config.json`` and ``README.md`` (its model card), and no
sub-directories; hidden files (fadat's ``.fadat-output.json`` marker) are left out. The index
may hold no staged change and ``models/archive.json`` no unstaged one (the commits are made with
git's own plumbing from the branch tip; other unstaged changes are left as they are). A name is
given once: an archived model is never replaced.

``restore`` writes an archived model's files to ``--output`` (default ``models/archive/NAME``,
which .gitignore ignores), each checked against the recorded size and SHA-256, all or nothing,
as ``fadat average`` writes a model directory (:mod:`fadat.outputs`: staged beside it, then
renamed into place, with fadat's marker): a model directory that fadat wrote is replaced only
with ``--force``, and a directory that fadat did not write is never touched.

``verify`` checks every entry (or the named ones): the model commit is in the repository and an
ancestor of HEAD, and its ``models/archive/NAME/`` holds exactly the recorded files with the
recorded sizes and SHA-256. ``list`` prints the entries as a Markdown table.

Exit status 0; 1 when ``verify`` finds a problem (one line per problem); 2 with one line
``model_archive: error: ...`` on stderr for bad input (a model directory that breaks the rules
above, an unknown or already used name, a dirty index, a model commit missing from a shallow
clone, a file whose bytes differ from the record). ``--repo`` names the repository (default:
the one holding the current directory).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

INDEX = "models/archive.json"
PREFIX = "models/archive"
FORMAT = 1
MAX_BYTES = 20_000_000
REQUIRED = ("model.safetensors", "config.json", "README.md")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ArchiveError(Exception):
    """Bad input: printed as one ``model_archive: error:`` line, exit status 2."""


def git(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> bytes:
    """Run ``git -C repo ARGS`` and return its stdout; a failure raises :class:`ArchiveError`
    with git's own message."""
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=input,
        capture_output=True,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
        raise ArchiveError(f"git {' '.join(args[:2])}: {msg}")
    return proc.stdout


def repo_root(path: str | None) -> Path:
    start = Path(path or ".").resolve()
    if not start.is_dir():
        raise ArchiveError(f"--repo {start}: not a directory")
    try:
        top = git(start, "rev-parse", "--show-toplevel").decode().strip()
    except ArchiveError:
        raise ArchiveError(f"{start}: not inside a git repository") from None
    return Path(top)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_index(repo: Path, rev: str | None = None) -> dict:
    """The archive index: from the working tree, or from commit ``rev``. Absent: empty."""
    if rev is None:
        path = repo / INDEX
        if not path.exists():
            return {"format": FORMAT, "models": {}}
        text = path.read_text(encoding="utf-8")
        where = str(path)
    else:
        try:
            text = git(repo, "show", f"{rev}:{INDEX}").decode("utf-8")
        except ArchiveError:
            return {"format": FORMAT, "models": {}}
        where = f"{rev}:{INDEX}"
    try:
        index = json.loads(text)
    except json.JSONDecodeError as e:
        raise ArchiveError(f"{where}: line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(index, dict) or not isinstance(index.get("models"), dict):
        raise ArchiveError(f'{where}: expected an object with a "models" object')
    if index.get("format") != FORMAT:
        raise ArchiveError(f"{where}: format {index.get('format')!r}, this script reads {FORMAT}")
    return index


def dump_index(index: dict) -> str:
    models = {k: index["models"][k] for k in sorted(index["models"])}
    return json.dumps({"format": FORMAT, "models": models}, indent=2, ensure_ascii=False) + "\n"


def check_model_dir(model: Path, max_bytes: int) -> dict[str, bytes]:
    """The files of a model directory that may be archived, by name; raises ArchiveError."""
    if not model.is_dir():
        raise ArchiveError(f"{model}: not a directory")
    files: dict[str, bytes] = {}
    for p in sorted(model.iterdir()):
        if p.name.startswith("."):  # fadat's own .fadat-output.json marker, editors' files
            continue
        if p.is_symlink() or not p.is_file():
            raise ArchiveError(f"{p}: only plain files are archived (no links or directories)")
        files[p.name] = p.read_bytes()
    missing = [n for n in REQUIRED if n not in files]
    if missing:
        raise ArchiveError(
            f"{model}: missing {', '.join(missing)} (a model directory with its card, README.md)"
        )
    weights = model / "model.safetensors"
    if len(files["model.safetensors"]) > max_bytes:
        raise ArchiveError(
            f"{weights}: {len(files['model.safetensors']):,} bytes, more than {max_bytes:,}"
        )
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a broken header
        raise ArchiveError(f"{weights}: not a safetensors file ({e})") from None
    wide = sorted(k for k, d in dtypes.items() if d in ("F32", "F64", "BF16"))
    if wide:
        raise ArchiveError(
            f"{weights}: tensor {wide[0]} (and {len(wide) - 1} more) is not fp16; store fp16 "
            "weights (fadat average --dtype float16)"
        )
    try:
        json.loads(files["config.json"])
    except json.JSONDecodeError as e:
        raise ArchiveError(f"{model / 'config.json'}: line {e.lineno}: {e.msg}") from None
    return files


def tree_with(repo: Path, base: str, blobs: dict[str, str]) -> str:
    """The tree of ``base`` with each ``path → blob`` added or replaced (a throw-away index)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", base, env=env)
        for path, blob in blobs.items():
            git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", env=env)
        return git(repo, "write-tree", env=env).decode().strip()


def cmd_add(repo: Path, model: Path, name: str, description: str, max_bytes: int) -> str:
    if not NAME_RE.match(name):
        raise ArchiveError(f"--name {name!r}: letters, digits, '.', '_' and '-' only")
    if not description:
        raise ArchiveError("--description: empty; one line saying what the model is")
    files = check_model_dir(model, max_bytes)
    head = git(repo, "rev-parse", "--verify", "HEAD").decode().strip()
    ref = subprocess.run(
        ["git", "-C", str(repo), "symbolic-ref", "-q", "HEAD"], capture_output=True, text=True
    )
    if ref.returncode != 0:
        raise ArchiveError(f"{repo}: HEAD is detached; check out the branch to archive on")
    branch = ref.stdout.strip()
    if (
        subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "-q", "--verify", "MERGE_HEAD"],
            capture_output=True,
        ).returncode
        == 0
    ):
        raise ArchiveError(f"{repo}: a merge is in progress")
    if subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--quiet"]).returncode != 0:
        raise ArchiveError(f"{repo}: the index holds staged changes; commit or unstage them first")
    dirty = git(repo, "status", "--porcelain", "--", INDEX).decode().strip()
    if dirty:
        raise ArchiveError(f"{repo / INDEX}: has uncommitted changes; commit or discard them first")
    index = read_index(repo, head)
    if name in index["models"]:
        raise ArchiveError(
            f"--name {name}: already archived (commit {index['models'][name]['commit'][:12]})"
        )
    blobs = {}
    for fname, data in files.items():
        blob = git(repo, "hash-object", "-w", "--stdin", input=data).decode().strip()
        blobs[f"{PREFIX}/{name}/{fname}"] = blob
    model_tree = tree_with(repo, head, blobs)
    model_commit = (
        git(
            repo,
            "commit-tree",
            model_tree,
            "-p",
            head,
            "-m",
            f"model {name}: {description}\n\nThe model's files, kept in history only: "
            f"scripts/model_archive.py restore {name}",
        )
        .decode()
        .strip()
    )
    index["models"][name] = {
        "commit": model_commit,
        "path": f"{PREFIX}/{name}",
        "description": description,
        "files": {f: {"bytes": len(d), "sha256": sha256(d)} for f, d in sorted(files.items())},
    }
    text = dump_index(index)
    index_blob = git(repo, "hash-object", "-w", "--stdin", input=text.encode()).decode().strip()
    merge_tree = tree_with(repo, head, {INDEX: index_blob})
    merge = (
        git(
            repo,
            "commit-tree",
            merge_tree,
            "-p",
            head,
            "-p",
            model_commit,
            "-m",
            f"models/archive: {name} ({description})\n\nIts files are in the second parent, not "
            f"in this tree: scripts/model_archive.py restore {name}",
        )
        .decode()
        .strip()
    )
    git(repo, "update-ref", "-m", f"model_archive add {name}", branch, merge, head)
    # the working tree's and the index's models/archive.json follow the new tip
    from fadat.outputs import atomic_write

    (repo / INDEX).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(repo / INDEX, text)
    git(repo, "reset", "-q", "--", INDEX)
    return merge


def entry_of(index: dict, name: str) -> dict:
    if name not in index["models"]:
        known = ", ".join(sorted(index["models"])) or "none"
        raise ArchiveError(f"{name}: not in {INDEX} (archived: {known})")
    return index["models"][name]


def commit_present(repo: Path, commit: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
        ).returncode
        == 0
    )


def problems_of(repo: Path, name: str, entry: dict) -> list[str]:
    """What is wrong with one archived model (empty: nothing)."""
    commit, path = entry["commit"], entry["path"]
    if not commit_present(repo, commit):
        shallow = git(repo, "rev-parse", "--is-shallow-repository").decode().strip() == "true"
        hint = " (a shallow clone: git fetch --unshallow)" if shallow else ""
        return [f"{name}: model commit {commit[:12]} is not in this repository{hint}"]
    out = []
    reach = subprocess.run(
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", commit, "HEAD"],
        capture_output=True,
    )
    if reach.returncode != 0:
        out.append(f"{name}: model commit {commit[:12]} is not an ancestor of HEAD")
    try:
        listed = git(repo, "ls-tree", "-z", f"{commit}:{path}").decode().split("\0")
    except ArchiveError:
        return out + [f"{name}: the model commit {commit[:12]} has no {path}/"]
    found = {line.split("\t", 1)[1] for line in listed if line}
    for extra in sorted(found - set(entry["files"])):
        out.append(f"{name}: {path}/{extra} is in the model commit but not in {INDEX}")
    for fname, rec in sorted(entry["files"].items()):
        if fname not in found:
            out.append(f"{name}: {path}/{fname} is missing from the model commit")
            continue
        data = git(repo, "cat-file", "blob", f"{commit}:{path}/{fname}")
        if len(data) != rec["bytes"] or sha256(data) != rec["sha256"]:
            out.append(
                f"{name}: {path}/{fname}: {len(data)} bytes, sha256 {sha256(data)[:16]}…, "
                f"recorded {rec['bytes']} bytes, {rec['sha256'][:16]}…"
            )
    return out


def cmd_restore(repo: Path, name: str, output: str | None, force: bool) -> Path:
    entry = entry_of(read_index(repo), name)
    problems = problems_of(repo, name, entry)
    if problems:
        raise ArchiveError(problems[0])
    from fadat import outputs
    from fadat.errors import InputError

    out = Path(output) if output else repo / PREFIX / name
    try:  # as fadat average writes a model directory: staged, then renamed into place
        outputs.check_whole_replacement(out, "model", "--output", force)
        staged = outputs.staging_dir(out)
        try:
            for fname in sorted(entry["files"]):
                data = git(repo, "cat-file", "blob", f"{entry['commit']}:{entry['path']}/{fname}")
                (staged / fname).write_bytes(data)
            outputs.replace_dir(staged, out, "model", "--output")
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    except InputError as e:
        raise ArchiveError(str(e)) from None
    return out


def cmd_verify(repo: Path, names: list[str]) -> list[str]:
    index = read_index(repo)
    names = names or sorted(index["models"])
    problems = []
    for name in names:
        problems += problems_of(repo, name, entry_of(index, name))
    return problems


def cmd_list(repo: Path) -> str:
    index = read_index(repo)
    lines = ["| name | commit | MB | description |", "|---|---|---:|---|"]
    for name, e in sorted(index["models"].items()):
        mb = sum(f["bytes"] for f in e["files"].values()) / 1e6
        lines.append(f"| {name} | {e['commit'][:12]} | {mb:.1f} | {e['description']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="model_archive",
        description="Models committed in history, not in the working tree (module docstring).",
    )
    ap.add_argument("--repo", help="the git repository (default: the one holding .)")
    sub = ap.add_subparsers(dest="verb", required=True)
    a = sub.add_parser("add", help="archive a model directory (two commits on this branch)")
    a.add_argument(
        "model", help="model directory: model.safetensors (fp16), config.json, README.md"
    )
    a.add_argument("--name", required=True)
    a.add_argument(
        "--description", required=True, help="one line: what the model is, for the index"
    )
    a.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="weights' limit, bytes")
    r = sub.add_parser("restore", help="write an archived model's files to a directory")
    r.add_argument("name")
    r.add_argument("--output", help=f"directory (default {PREFIX}/NAME)")
    r.add_argument("--force", action="store_true", help="replace an existing output directory")
    v = sub.add_parser("verify", help="check the archived models against the index")
    v.add_argument("names", nargs="*")
    sub.add_parser("list", help="the index as a Markdown table")
    args = ap.parse_args(argv)
    try:
        repo = repo_root(args.repo)
        if args.verb == "add":
            desc = " ".join(args.description.split())
            commit = cmd_add(repo, Path(args.model), args.name, desc, args.max_bytes)
            print(f"archived {args.name}: merge {commit[:12]} on {repo}")
        elif args.verb == "restore":
            print(cmd_restore(repo, args.name, args.output, args.force))
        elif args.verb == "verify":
            problems = cmd_verify(repo, args.names)
            for p in problems:
                print(p)
            if problems:
                return 1
            print(f"{len(args.names) or len(read_index(repo)['models'])} archived model(s): ok")
        else:
            print(cmd_list(repo))
    except ArchiveError as e:
        print(f"model_archive: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
