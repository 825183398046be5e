"""scripts/model_archive.py: models committed in history, not in the working tree."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("model_archive", ROOT / "scripts/model_archive.py")
ma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ma)

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch):
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "README.md").write_text("project\n")
    git(r, "add", "README.md")
    git(r, "commit", "-q", "-m", "first")
    return r


def make_model(d: Path, dtype=torch.float16, seed: int = 0) -> Path:
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    save_file(
        {"w": torch.randn(8, 4, generator=g).to(dtype), "steps": torch.arange(3)},
        str(d / "model.safetensors"),
    )
    (d / "config.json").write_text(json.dumps({"d_model": 4}))
    (d / "README.md").write_text(f"# model {seed}\n")
    (d / "spm.model").write_bytes(bytes(range(256)) * 3)
    return d


def run(repo: Path, *args: str) -> int:
    if args[0] == "add" and "--description" not in args:
        args = (*args, "--description", "a model")
    return ma.main(["--repo", str(repo), *args])


def files_of(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if not p.name.startswith(".")}


def test_add_commits_the_model_in_history_only(repo, tmp_path, capsys):
    model = make_model(tmp_path / "m")
    (model / ".fadat-output.json").write_text("{}")  # fadat's marker: not archived
    before = git(repo, "rev-parse", "HEAD").strip()
    assert run(repo, "add", str(model), "--name", "m1", "--description", "a test  model") == 0
    head = git(repo, "rev-parse", "HEAD").strip()
    # a merge of the old tip and the model commit; the tip's tree gains only the index
    parents = git(repo, "rev-list", "--parents", "-n", "1", "HEAD").split()[1:]
    assert parents[0] == before and len(parents) == 2
    assert git(repo, "diff", "--name-only", before, head).split() == ["models/archive.json"]
    assert "models/archive/m1" not in git(repo, "ls-tree", "-r", "--name-only", "HEAD")
    tree = git(repo, "ls-tree", "-r", "--name-only", parents[1]).split()
    assert sorted(t for t in tree if t.startswith("models/archive/m1/")) == [
        f"models/archive/m1/{n}" for n in sorted(files_of(model))
    ]
    # nothing left staged or modified; the working tree's index is the tip's
    assert git(repo, "status", "--porcelain") == ""
    entry = json.loads((repo / "models/archive.json").read_text())["models"]["m1"]
    assert entry["commit"] == parents[1] and entry["description"] == "a test model"
    for name, data in files_of(model).items():
        assert entry["files"][name] == {
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    assert run(repo, "verify") == 0


def test_restore_writes_the_same_bytes_in_a_full_clone_not_in_a_shallow_one(repo, tmp_path, capsys):
    model = make_model(tmp_path / "m")
    assert run(repo, "add", str(model), "--name", "m1") == 0
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    assert not (clone / "models/archive/m1").exists()
    assert run(clone, "restore", "m1") == 0
    assert files_of(clone / "models/archive/m1") == files_of(model)
    # again: refused without --force, replaced with it
    capsys.readouterr()
    assert run(clone, "restore", "m1") == 2
    assert "an existing model directory; pass --force" in capsys.readouterr().err
    (clone / "models/archive/m1/spm.model").write_bytes(b"changed")
    assert run(clone, "restore", "m1", "--force") == 0
    assert files_of(clone / "models/archive/m1") == files_of(model)
    assert not [p for p in (clone / "models/archive").iterdir() if p.name.startswith(".")]
    out = tmp_path / "elsewhere"
    assert run(clone, "restore", "m1", "--output", str(out)) == 0
    assert files_of(out) == files_of(model)
    # a directory that fadat did not write is never replaced, not even with --force
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    capsys.readouterr()
    assert run(clone, "restore", "m1", "--output", str(mine), "--force") == 2
    assert "did not create" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True
    )
    capsys.readouterr()
    assert run(shallow, "restore", "m1") == 2
    err = capsys.readouterr().err
    assert "not in this repository" in err and "git fetch --unshallow" in err
    assert not (shallow / "models/archive/m1").exists()


def test_two_models_and_the_list(repo, tmp_path, capsys):
    assert run(repo, "add", str(make_model(tmp_path / "a", seed=1)), "--name", "a") == 0
    assert run(repo, "add", str(make_model(tmp_path / "b", seed=2)), "--name", "b") == 0
    index = json.loads((repo / "models/archive.json").read_text())["models"]
    assert sorted(index) == ["a", "b"]
    # b's model commit is built on the tip that already held a's entry
    assert (
        git(repo, "merge-base", "--is-ancestor", index["a"]["commit"], index["b"]["commit"]) == ""
    )
    assert run(repo, "verify") == 0
    capsys.readouterr()
    assert run(repo, "list") == 0
    out = capsys.readouterr().out
    assert "| a | " in out and "| b | " in out
    assert run(repo, "restore", "a") == 0 and run(repo, "restore", "b") == 0
    assert files_of(repo / "models/archive/a") == files_of(tmp_path / "a")
    assert files_of(repo / "models/archive/b") == files_of(tmp_path / "b")


def test_a_changed_record_is_found_by_verify_and_refused_by_restore(repo, tmp_path, capsys):
    assert run(repo, "add", str(make_model(tmp_path / "m")), "--name", "m1") == 0
    path = repo / "models/archive.json"
    index = json.loads(path.read_text())
    index["models"]["m1"]["files"]["spm.model"]["sha256"] = "0" * 64
    path.write_text(json.dumps(index))
    capsys.readouterr()
    assert run(repo, "verify") == 1
    assert "models/archive/m1/spm.model" in capsys.readouterr().out
    assert run(repo, "restore", "m1") == 2
    assert "spm.model" in capsys.readouterr().err
    assert not (repo / "models/archive/m1").exists()
    # a listed file the commit lacks, and a commit that is not there at all
    index["models"]["m1"]["files"]["spm.model"] = {"bytes": 1, "sha256": "0" * 64}
    index["models"]["m1"]["files"]["extra.bin"] = {"bytes": 1, "sha256": "0" * 64}
    path.write_text(json.dumps(index))
    assert run(repo, "verify") == 1
    assert "extra.bin is missing from the model commit" in capsys.readouterr().out
    index["models"]["m1"]["path"] = "models/archive/elsewhere"
    path.write_text(json.dumps(index))
    assert run(repo, "verify") == 1
    assert "has no models/archive/elsewhere/" in capsys.readouterr().out
    index["models"]["m1"]["commit"] = "1" * 40
    path.write_text(json.dumps(index))
    assert run(repo, "verify") == 1
    assert "is not in this repository" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: (d / "README.md").unlink(), "missing README.md"),
        (lambda d: (d / "sub").mkdir(), "only plain files"),
        (lambda d: (d / "config.json").write_text("{oops"), "config.json: line 1"),
        (lambda d: (d / "model.safetensors").write_bytes(b"garbage"), "not a safetensors"),
    ],
)
def test_add_refuses_a_model_directory_that_breaks_the_rules(
    repo, tmp_path, capsys, change, message
):
    model = make_model(tmp_path / "m")
    change(model)
    head = git(repo, "rev-parse", "HEAD")
    assert run(repo, "add", str(model), "--name", "m1") == 2
    assert message in capsys.readouterr().err
    assert git(repo, "rev-parse", "HEAD") == head and not (repo / "models").exists()


def test_add_refuses_wide_or_large_weights_a_used_name_and_a_dirty_index(repo, tmp_path, capsys):
    head = git(repo, "rev-parse", "HEAD")
    fp32 = make_model(tmp_path / "f32", dtype=torch.float32)
    assert run(repo, "add", str(fp32), "--name", "m1") == 2
    assert "not fp16" in capsys.readouterr().err
    model = make_model(tmp_path / "m")
    assert run(repo, "add", str(model), "--name", "m1", "--max-bytes", "100") == 2
    assert "more than 100" in capsys.readouterr().err
    assert run(repo, "add", str(model), "--name", "../x") == 2
    assert "letters, digits" in capsys.readouterr().err
    assert run(repo, "add", str(model), "--name", "m1", "--description", "  ") == 2
    assert "--description: empty" in capsys.readouterr().err
    (repo / "staged.txt").write_text("x")
    git(repo, "add", "staged.txt")
    assert run(repo, "add", str(model), "--name", "m1") == 2
    assert "staged changes" in capsys.readouterr().err
    assert git(repo, "rev-parse", "HEAD") == head
    git(repo, "reset", "-q")
    # an unstaged change elsewhere stays as it was
    (repo / "README.md").write_text("edited\n")
    assert run(repo, "add", str(model), "--name", "m1") == 0
    assert git(repo, "status", "--porcelain").split() == ["M", "README.md", "??", "staged.txt"]
    capsys.readouterr()
    assert run(repo, "add", str(model), "--name", "m1") == 2
    assert "already archived" in capsys.readouterr().err
    git(repo, "checkout", "-q", "--detach")
    assert run(repo, "add", str(model), "--name", "m2") == 2
    assert "detached" in capsys.readouterr().err


def test_this_repository_archive_is_complete():
    """Every model in this repository's models/archive.json is in its history as recorded."""
    if not (ROOT / ma.INDEX).exists():
        pytest.skip("no archived models")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    shallow = git(ROOT, "rev-parse", "--is-shallow-repository").strip() == "true"
    if shallow:
        pytest.skip("a shallow clone holds no archived model (git fetch --unshallow)")
    assert ma.cmd_verify(ROOT, []) == []
