"""Never delete what fadat did not create (fadat.outputs), for the module and every verb that
writes: a foreign folder and a regular file at an output path survive, with and without
--force; an output location that cannot be written is refused before any work; outputs are
written all-or-nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_translate import random_sentences

from fadat import cli, outputs
from fadat.errors import InputError


def foreign_dir(path: Path) -> Path:
    """A user's folder: one file in it."""
    path.mkdir(parents=True)
    (path / "thesis.txt").write_text("years of work\n")
    return path


def user_file(path: Path) -> Path:
    path.write_text("a user's file\n")
    return path


def fails_with_one_line(argv: list[str], capsys, *needles: str) -> str:
    """Run the CLI: exit 2, one line on stderr containing every needle; returns the line."""
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def no_work(monkeypatch, module, *names: str) -> None:
    """Make the named functions of ``module`` fail the test if called (the work must not
    start before the output check refused)."""
    for name in names:

        def called(*args, _name=name, **kwargs):
            raise AssertionError(f"{_name} ran before the output was checked")

        monkeypatch.setattr(module, name, called)


def no_corpus_work(monkeypatch, module, record: str) -> None:
    """Make the corpus record ``module.record`` fail the test if it makes its corpus or looks
    for its input files (the corpora's registry reads the record from its module)."""
    import dataclasses

    def called(*args, **kwargs):
        raise AssertionError(f"{record} was read before the output was checked")

    spec = getattr(module, record)
    monkeypatch.setattr(module, record, dataclasses.replace(spec, make=called, inputs=called))


# ----------------------------------------------------------------------------------------------
# The module


def test_check_output_dir_states(tmp_path):
    assert outputs.check_output_dir(tmp_path / "new", "dataset") is False
    assert not (tmp_path / "new").exists()  # nothing created by a check
    (tmp_path / "empty").mkdir()
    assert outputs.check_output_dir(tmp_path / "empty", "dataset") is False
    ours = outputs.mark_dir(tmp_path / "ours", "dataset")
    assert json.loads((ours / outputs.MARKER).read_text())["kind"] == "dataset"
    assert outputs.check_output_dir(ours, "dataset") is True
    with pytest.raises(InputError, match="a fadat dataset directory, not a model directory"):
        outputs.check_output_dir(ours, "model")
    foreign = foreign_dir(tmp_path / "foreign")
    with pytest.raises(InputError, match="did not create"):
        outputs.check_output_dir(foreign, "dataset")
    with pytest.raises(InputError, match="did not create"):
        outputs.mark_dir(foreign, "dataset")
    assert not (foreign / outputs.MARKER).exists()
    f = user_file(tmp_path / "file")
    with pytest.raises(InputError, match="not a directory"):
        outputs.check_output_dir(f, "dataset")
    with pytest.raises(InputError, match="is a file, not a directory"):
        outputs.check_output_dir(f / "below", "dataset")
    assert f.read_text() == "a user's file\n"


def test_legacy_directories_are_recognised(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({"format": 1, "fingerprint": "x"}))
    assert outputs.output_kind(data) == "dataset"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "dat", "format_version": 1}))
    assert outputs.output_kind(model) == "model"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "train.log").write_text("")
    assert outputs.output_kind(run) == "run"
    # A user's config.json is not a model directory.
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert outputs.output_kind(other) is None


def staged(tmp_path: Path, files: dict[str, str]) -> Path:
    tmp = outputs.staging_dir(tmp_path / "out")
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


def test_replace_dir_keeps_files_fadat_did_not_write(tmp_path):
    out = tmp_path / "out"
    outputs.replace_dir(staged(tmp_path, {"meta.json": "1", "raw/a.txt": "a"}), out, "dataset")
    assert (out / "meta.json").read_text() == "1" and (out / "raw/a.txt").read_text() == "a"
    assert json.loads((out / outputs.MARKER).read_text())["files"] == ["meta.json", "raw/a.txt"]
    # Replaced: the old build's own files may go.
    outputs.replace_dir(staged(tmp_path, {"meta.json": "2"}), out, "dataset")
    assert (out / "meta.json").read_text() == "2" and not (out / "raw").exists()
    # A user's file in it: refused before (check_replaceable) and at the end (replace_dir).
    user_file(out / "notes.txt")
    with pytest.raises(InputError, match="holds notes.txt, which fadat did not write"):
        outputs.check_replaceable(out, "dataset")
    new = staged(tmp_path, {"meta.json": "3"})
    with pytest.raises(InputError, match="notes.txt"):
        outputs.replace_dir(new, out, "dataset")
    assert (out / "notes.txt").exists() and (out / "meta.json").read_text() == "2"
    # Unless the new build writes a file of that name itself.
    outputs.replace_dir(staged(tmp_path, {"meta.json": "4", "notes.txt": "n"}), out, "dataset")
    assert (out / "notes.txt").read_text() == "n"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert leftovers == [new.name]  # the refused staging directory is the caller's to remove


def test_replace_legacy_dataset_by_file_names(tmp_path):
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    for name in ("meta.json", "spm.model", "train.src.ids.npy", "raw/test.ref2.txt"):
        (out / name).write_text("{}" if name == "meta.json" else "x")
    (out / "meta.json").write_text(json.dumps({"format": 1, "fingerprint": "x"}))
    outputs.check_replaceable(out, "dataset")
    user_file(out / "raw" / "mine.txt")
    with pytest.raises(InputError, match="raw/mine.txt"):
        outputs.check_replaceable(out, "dataset")


def test_unwritable_location_is_refused(tmp_path):
    blocker = user_file(tmp_path / "blocker")
    with pytest.raises(InputError, match="--output .*blocker/x/y.txt: .*is a file"):
        outputs.check_output_file(blocker / "x" / "y.txt")
    with pytest.raises(InputError, match="is a directory"):
        outputs.check_output_file(tmp_path)
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(InputError, match="cannot write in"):
            outputs.check_output_file(locked / "out.txt")
        with pytest.raises(InputError, match="cannot write in"):
            outputs.check_output_dir(locked / "new", "dataset")
    finally:
        locked.chmod(0o755)


def test_atomic_path_all_or_nothing(tmp_path):
    target = user_file(tmp_path / "out.txt")
    with pytest.raises(RuntimeError), outputs.atomic_path(target) as tmp:
        assert tmp.suffix == ".txt" and tmp.parent == tmp_path
        tmp.write_text("half")
        raise RuntimeError
    assert target.read_text() == "a user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    outputs.atomic_write(target, "done\n")
    assert target.read_text() == "done\n"
    assert (target.stat().st_mode & 0o777) == 0o666 & ~_umask()


def test_model_directory_files_have_the_umask_mode(tmp_path):
    """model.safetensors is as readable as config.json (safetensors writes 0600 by itself)."""
    from fadat.models.directory import save_model_directory
    from fadat.training.config import TrainConfig
    from fadat.training.trainer import build_model

    save_model_directory(build_model(TrainConfig(data="d", run_dir="r"), 12), tmp_path / "m")
    for name in ("model.safetensors", "config.json"):
        assert ((tmp_path / "m" / name).stat().st_mode & 0o777) == 0o666 & ~_umask(), name


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------------------------
# fadat prepare


def corpus_files(tmp_path: Path) -> list[str]:
    src = tmp_path / "train.src"
    src.write_text("\n".join(random_sentences(60, 1)) + "\n")
    return [
        "prepare",
        "--source-file",
        str(src),
        "--target-file",
        str(src),
        "--source-lang",
        "en",
        "--target-lang",
        "en",
        "--vocab-size",
        "16",
        "--model-type",
        "word",
    ]


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_prepare_never_replaces_a_foreign_folder_or_file(tmp_path, capsys, monkeypatch, force):
    import fadat.data.bible as bible
    import fadat.data.prepare as prepare

    argv = corpus_files(tmp_path)
    folder = foreign_dir(tmp_path / "folder")
    no_work(monkeypatch, prepare, "build")
    no_corpus_work(monkeypatch, bible, "BIBLE_EN_ES")
    fails_with_one_line([*argv, "--output", str(folder), *force], capsys, "did not create")
    assert sorted(p.name for p in folder.iterdir()) == ["thesis.txt"]
    assert (folder / "thesis.txt").read_text() == "years of work\n"
    f = user_file(tmp_path / "file")
    fails_with_one_line([*argv, "--output", str(f), *force], capsys, "not a directory")
    assert f.read_text() == "a user's file\n"
    # A built-in corpus: the output is checked before its input files are looked at.
    fails_with_one_line(
        ["prepare", "bible-en-es", "--output", str(folder), *force], capsys, "did not create"
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".folder.", ".file."))]


def test_prepare_unwritable_output_refused_before_work(tmp_path, capsys, monkeypatch):
    import fadat.data.corpora as corpora
    import fadat.data.prepare as prepare

    no_work(monkeypatch, prepare, "build")
    no_corpus_work(monkeypatch, corpora, "PARALLEL_TEXT_CORPUS")
    blocker = user_file(tmp_path / "blocker")
    argv = corpus_files(tmp_path)
    fails_with_one_line([*argv, "--output", str(blocker / "data")], capsys, "is a file")


def test_prepare_force_keeps_a_users_file_in_a_dataset(tmp_path, capsys):
    argv = corpus_files(tmp_path)
    out = tmp_path / "data"
    assert cli.main([*argv, "--output", str(out)]) == 0
    capsys.readouterr()
    assert outputs.output_kind(out) == "dataset"
    meta = (out / "meta.json").read_bytes()
    user_file(out / "notes.txt")
    fails_with_one_line(
        [*argv, "--vocab-size", "15", "--output", str(out), "--force"], capsys, "notes.txt"
    )
    assert (out / "notes.txt").exists() and (out / "meta.json").read_bytes() == meta
    (out / "notes.txt").unlink()
    assert cli.main([*argv, "--vocab-size", "15", "--output", str(out), "--force"]) == 0
    assert json.loads((out / "meta.json").read_text())["vocab_size"] == 15
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ----------------------------------------------------------------------------------------------
# fadat train, average


def test_train_run_dir_must_be_new_or_a_run(tmp_path, capsys, monkeypatch):
    import fadat.training.trainer as train

    no_work(monkeypatch, train, "load_data")
    base = ["train", "--data", str(tmp_path / "data"), "--max-updates", "1"]
    folder = foreign_dir(tmp_path / "folder")
    fails_with_one_line([*base, "--run-dir", str(folder)], capsys, "--run-dir", "did not create")
    f = user_file(tmp_path / "file")
    fails_with_one_line([*base, "--run-dir", str(f)], capsys, "not a directory")
    fails_with_one_line([*base, "--run-dir", str(f / "run")], capsys, "is a file")
    data = outputs.mark_dir(tmp_path / "data", "dataset")
    fails_with_one_line([*base, "--run-dir", str(data)], capsys, "is the --data")
    other = outputs.mark_dir(tmp_path / "other", "dataset")
    fails_with_one_line([*base, "--run-dir", str(other)], capsys, "a fadat dataset directory")
    assert sorted(p.name for p in folder.iterdir()) == ["thesis.txt"]
    assert f.read_text() == "a user's file\n"


def test_average_output_checked_before_averaging(tmp_path, capsys, monkeypatch, models):
    import fadat.training.average as average

    no_work(monkeypatch, average, "write_averaged_model", "best_checkpoints")
    folder = foreign_dir(tmp_path / "folder")
    argv = ["average", "--checkpoints", str(tmp_path / "x.pt"), "--output"]
    fails_with_one_line([*argv, str(folder)], capsys, "did not create")
    f = user_file(tmp_path / "file")
    fails_with_one_line([*argv, str(f)], capsys, "not a directory")
    # An existing model directory is replaced only with --force: the check lets the work start.
    fails_with_one_line([*argv, str(models["dat"])], capsys, "--force")
    with pytest.raises(AssertionError, match="write_averaged_model ran"):
        cli.main([*argv, str(models["dat"]), "--force"])


def test_save_pretrained_keeps_other_files_of_a_model_directory(tmp_path, models):
    from fadat.models.directory import load_pretrained

    model = load_pretrained(models["dat"])
    target = tmp_path / "model"
    model.save_pretrained(target, spm_model=models["spm"])
    user_file(target / "README.md")
    model.save_pretrained(target, spm_model=models["spm"])
    assert (target / "README.md").read_text() == "a user's file\n"
    assert outputs.output_kind(target) == "model"
    with pytest.raises(InputError, match="did not create"):
        model.save_pretrained(foreign_dir(tmp_path / "folder"))
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["thesis.txt"]


# ----------------------------------------------------------------------------------------------
# fadat translate, score, evaluate, analyze, show-graph


def test_file_outputs_checked_before_work(tmp_path, capsys, models, monkeypatch):
    import fadat.cli.score
    import fadat.cli.translate
    import fadat.evaluation.analysis
    import fadat.evaluation.evaluate

    folder = foreign_dir(tmp_path / "folder")
    blocker = user_file(tmp_path / "blocker")
    no_work(monkeypatch, fadat.cli.translate, "load_translation_model", "read_lines")
    no_work(monkeypatch, fadat.cli.score, "load_model", "read_pairs")
    no_work(monkeypatch, fadat.evaluation.analysis, "load_dat_model")
    no_work(
        monkeypatch,
        fadat.evaluation.evaluate,
        "load_split",
        "read_languages",
        "load_translation_model",
    )
    m = str(models["dat"])
    for argv in (
        ["translate", "--model", m, "--output"],
        ["score", "--model", m, "--output"],
        ["show-graph", "--model", m, "a b", "-o"],
    ):
        for bad, needle in ((folder, "is a directory"), (blocker / "x.png", "is a file")):
            fails_with_one_line([*argv, str(bad)], capsys, needle)
    base = ["--model", m, "--data", str(tmp_path / "data")]
    fails_with_one_line(["analyze", *base, "-o", str(folder)], capsys, "did not create")
    fails_with_one_line(["analyze", *base, "-o", str(blocker)], capsys, "not a directory")
    fails_with_one_line(["evaluate", *base, "--report", str(folder)], capsys, "is a directory")
    fails_with_one_line(
        ["evaluate", *base, "--save-hypotheses", str(folder)], capsys, "did not create"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["thesis.txt"]
    assert blocker.read_text() == "a user's file\n"


def test_translate_file_output_is_all_or_nothing(tmp_path, capsys, models, monkeypatch):
    import fadat.cli.translate as translate

    src = tmp_path / "in.txt"
    src.write_text("ab cd\nef gh\n")
    out = user_file(tmp_path / "out.txt")

    def broken(*args, **kwargs):
        raise RuntimeError("internal error in the middle")

    monkeypatch.setattr(translate, "format_translations", broken)
    argv = ["translate", "--model", str(models["dat"]), "--input", str(src), "--output", str(out)]
    argv.append("--force")  # out.txt is a user's file
    with pytest.raises(RuntimeError):
        cli.main(argv)
    assert out.read_text() == "a user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert len(out.read_text().splitlines()) == 2


# ----------------------------------------------------------------------------------------------
# Output files: replaced only when fadat wrote them (or with --force), never inside a dataset,
# model or run, and a trailing slash names a directory.


def test_a_file_is_replaced_only_when_fadat_wrote_it(tmp_path):
    out = tmp_path / "out.txt"
    assert outputs.check_output_file(out) == out  # new: fine
    outputs.atomic_write(out, "first\n", record=True)
    assert outputs.fadat_wrote(out)
    outputs.check_output_file(out)  # fadat's own file: replaced without --force
    outputs.atomic_write(out, "second\n", record=True)
    assert outputs.fadat_wrote(out) and out.read_text() == "second\n"
    # Changed by someone else since (same size, a new modification time): the user's now.
    os.utime(out, ns=(0, out.stat().st_mtime_ns + 10**9))
    assert not outputs.fadat_wrote(out)
    with pytest.raises(InputError, match="fadat did not write it; pass --force"):
        outputs.check_output_file(out)
    outputs.check_output_file(out, force=True)
    # Replaced by another file of the same name: not fadat's either.
    outputs.atomic_write(out, "third\n", record=True)
    out.unlink()
    user_file(out)
    with pytest.raises(InputError, match="fadat did not write it"):
        outputs.check_output_file(out)
    # A user's file next to fadat's: refused; the record lists only what fadat wrote.
    mine = user_file(tmp_path / "mine.txt")
    with pytest.raises(InputError, match=f"--report {mine}: exists and fadat did not write"):
        outputs.check_output_file(mine, "--report")
    assert mine.read_text() == "a user's file\n"
    # atomic_write without record (a file inside fadat's own directory) records nothing.
    outputs.atomic_write(tmp_path / "plain.txt", "x\n")
    assert not outputs.fadat_wrote(tmp_path / "plain.txt")


def test_trailing_slash_names_a_directory(tmp_path):
    for path in (f"{tmp_path}/new/", f"{tmp_path}/"):
        with pytest.raises(InputError, match="names a directory .it ends in '/'"):
            outputs.check_output_file(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_nothing_is_written_into_a_dataset_model_or_run(tmp_path):
    data = outputs.mark_dir(tmp_path / "data", "dataset")
    run = outputs.mark_dir(tmp_path / "run", "run")
    for inside, kind in ((data / "notes.txt", "dataset"), (run / "sub" / "x.json", "run")):
        with pytest.raises(InputError, match=f"lies inside the fadat {kind} directory"):
            outputs.check_output_file(inside, force=True)
        with pytest.raises(InputError, match=f"lies inside the fadat {kind} directory"):
            outputs.check_output_dir(inside, "analysis")
    with pytest.raises(InputError, match="is a file of the fadat run directory"):
        outputs.check_output_file(run / "checkpoint_last.pt", force=True)


def test_file_output_verbs_follow_the_rules(tmp_path, capsys, models, monkeypatch):
    """translate, score, show-graph, evaluate --report: a user's file needs --force, a name
    ending in '/' is refused (no file named like the directory), nothing goes into a run."""
    src = tmp_path / "in.txt"
    src.write_text("ab cd\nef gh\n")
    m = str(models["dat"])
    out = tmp_path / "out.txt"
    translate = ["translate", "--model", m, "--input", str(src), "--output", str(out)]
    assert cli.main(translate) == 0
    assert cli.main(translate) == 0  # fadat's own output: replaced
    capsys.readouterr()
    with out.open("a") as f:
        f.write("my note\n")  # edited by the user
    fails_with_one_line(translate, capsys, f"--output {out}", "did not write it", "--force")
    assert out.read_text().endswith("my note\n")
    assert cli.main([*translate, "--force"]) == 0
    assert "my note" not in out.read_text()

    import fadat.cli.score
    import fadat.cli.translate
    import fadat.evaluation.evaluate

    no_work(monkeypatch, fadat.cli.translate, "load_translation_model", "read_lines")
    no_work(monkeypatch, fadat.cli.score, "load_model", "read_pairs")
    no_work(
        monkeypatch,
        fadat.evaluation.evaluate,
        "load_split",
        "read_languages",
        "load_translation_model",
    )
    mine = user_file(tmp_path / "mine.png")
    run = outputs.mark_dir(tmp_path / "run", "run")
    for argv, flag in (
        (["translate", "--model", m, "--output"], "--output"),
        (["score", "--model", m, "--output"], "--output"),
        (["show-graph", "a b", "--model", m, "-o"], "--output"),
        (["evaluate", "--model", m, "--data", str(tmp_path / "d"), "--report"], "--report"),
    ):
        fails_with_one_line([*argv, str(mine)], capsys, f"{flag} {mine}", "--force")
        fails_with_one_line([*argv, f"{tmp_path}/dir/"], capsys, f"{flag} {tmp_path}/dir/", "'/'")
        fails_with_one_line([*argv, str(run / "r.png"), "--force"], capsys, "fadat run directory")
    assert mine.read_text() == "a user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "in.txt",
        "mine.png",
        "out.txt",
        "run",
    ]


def _shortlist_argv(tmp_path: Path, model: Path) -> list[str]:
    src = tmp_path / "train.txt"
    src.write_text("ab cd ef\ngh ij\n", encoding="utf-8")
    return ["shortlist", "--model", str(model), "--source", str(src), "--target", str(src)]


def test_shortlist_never_writes_over_models_datasets_runs_or_users_files(tmp_path, capsys, models):
    import shutil

    model = Path(shutil.copytree(models["dat"], tmp_path / "dat"))
    argv = _shortlist_argv(tmp_path, model)
    data = outputs.mark_dir(tmp_path / "data", "dataset")
    (data / "meta.json").write_text('{"fingerprint": "x", "format": 1}\n')
    run = outputs.mark_dir(tmp_path / "run", "run")
    (run / "checkpoint_last.pt").write_bytes(b"weights of a run")
    at = Path(models["at"])
    protected = {
        model / "config.json": "lies inside the --model",
        model / "model.safetensors": "lies inside the --model",
        at / "config.json": "a file of the fadat model directory",
        at / "model.safetensors": "a file of the fadat model directory",
        data / "meta.json": "a file of the fadat dataset directory",
        run / "checkpoint_last.pt": "a file of the fadat run directory",
        run / "shortlist.safetensors": "lies inside the fadat run directory",
    }
    before = {p: p.read_bytes() for p in protected if p.exists()}
    for path, needle in protected.items():
        for force in ([], ["--force"]):
            fails_with_one_line([*argv, "--output", str(path), *force], capsys, needle)
    assert {p: p.read_bytes() for p in before} == before
    assert not (run / "shortlist.safetensors").exists()
    # A user's file: only with --force.
    mine = user_file(tmp_path / "mine.safetensors")
    fails_with_one_line([*argv, "--output", str(mine)], capsys, "did not write it", "--force")
    assert mine.read_text() == "a user's file\n"
    assert cli.main([*argv, "--output", str(mine), "--force"]) == 0
    assert cli.main([*argv, "--output", str(mine)]) == 0  # now fadat's own
    # A trailing slash names a directory: no file named 'lists'.
    fails_with_one_line([*argv, "--output", f"{tmp_path}/lists/"], capsys, "ends in '/'")
    assert not (tmp_path / "lists").exists()


def test_shortlist_default_output_is_a_file_of_its_model(tmp_path, capsys, models):
    import shutil

    from fadat.models.shortlist import SHORTLIST_NAME

    model = Path(shutil.copytree(models["dat"], tmp_path / "dat"))
    argv = _shortlist_argv(tmp_path, model)
    assert cli.main(argv) == 0
    assert cli.main(argv) == 0  # its own file: replaced without --force
    assert outputs.check_output_dir(model, "model") is True
    # A model whose marker lists its files (fadat average) lists the shortlist too, so that
    # `fadat average --force` may replace the model as a whole.
    listed = tmp_path / "listed"
    staged = outputs.staging_dir(listed)
    for name in ("config.json", "model.safetensors", "spm.model"):
        shutil.copy(model / name, staged / name)
    outputs.replace_dir(staged, listed, "model")
    assert cli.main(_shortlist_argv(tmp_path, listed)) == 0
    assert SHORTLIST_NAME in json.loads((listed / outputs.MARKER).read_text())["files"]
    outputs.check_replaceable(listed, "model")


# ----------------------------------------------------------------------------------------------
# One process per run directory


_HOLD_LOCK = """
import sys
from fadat import outputs

with outputs.directory_lock(sys.argv[1], "run", "--run-dir"):
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes stdin or kills this process
"""


def hold_directory_lock(path: Path):
    """Another process that holds ``path``'s lock (:func:`fadat.outputs.directory_lock`), as a
    trainer does from before it writes anything; returns it once it holds the lock."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    line = proc.stdout.readline()
    if line != "locked\n":
        proc.kill()
        raise AssertionError(f"the lock holder failed: {proc.communicate()[1]}")
    return proc


def test_a_run_directory_that_another_process_holds_is_refused(tmp_path, capsys, monkeypatch):
    import fadat.training.trainer as train

    no_work(monkeypatch, train, "load_data")
    run = tmp_path / "run"
    argv = ["train", "--data", str(tmp_path / "data"), "--run-dir", str(run), "--max-updates", "1"]
    # A trainer that has just created and locked a new run directory, before marking it.
    holder = hold_directory_lock(run)
    try:
        assert sorted(p.name for p in run.iterdir()) == [outputs.LOCK]
        fails_with_one_line(argv, capsys, f"--run-dir {run}:", f"PID {holder.pid}", "in use")
        outputs.mark_dir(run, "run")  # the holder goes on: a run, still held
        fails_with_one_line(argv, capsys, f"--run-dir {run}:", f"PID {holder.pid}")
        with (
            pytest.raises(InputError, match=f"PID {holder.pid}"),
            outputs.directory_lock(run, "run"),
        ):
            pass
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    with outputs.directory_lock(run, "run") as is_run:
        assert is_run
        assert (run / outputs.LOCK).read_text() == f"{os.getpid()}\n"


def test_directory_lock_leaves_no_directory_after_a_failed_start(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError), outputs.directory_lock(run, "run"):
        raise RuntimeError("bad data")
    assert list(tmp_path.iterdir()) == []
    # A lock left in a directory by a process killed before it marked it: taken over.
    run.mkdir()
    (run / outputs.LOCK).write_text("12345\n")
    with outputs.directory_lock(run, "run") as is_run:
        assert not is_run
    folder = foreign_dir(tmp_path / "folder")
    with pytest.raises(InputError, match="did not create"), outputs.directory_lock(folder, "run"):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["thesis.txt"]
