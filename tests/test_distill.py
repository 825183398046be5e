"""Tests of ``fadat distill`` on small generated data: the distilled targets are the teacher's
beam outputs, a run killed (between batches, mid-write, or by SIGKILL) and resumed writes the
same files as an uninterrupted one, and a teacher with another vocabulary is a clear error."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_translate import random_sentences

from fadat import cli
from fadat.data.binarized import BinarizedDataset, read_meta
from fadat.data.contract import BOS_ID, EOS_ID
from fadat.errors import InputError
from fadat.models.at import ATModel
from fadat.models.config import make_config
from fadat.translation.distill import PARTIAL, Distillation, distill

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def generated(root: str) -> dict[str, Path]:
    """A prepared dataset of 300 random word sentences (word-level vocabulary of 16) and a
    random-weight AT teacher with its sentencepiece model (``init_std`` 0.5: peaked
    distributions, so outputs differ between sentences)."""
    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    argv = ["prepare"]
    for k, (split, n) in enumerate((("train", 300), ("valid", 10), ("test", 10))):
        src, tgt = random_sentences(n, seed=10 + k), random_sentences(n, seed=20 + k)
        prefix = "" if split == "train" else f"{split}-"
        for side, lines in (("source", src), ("target", tgt)):
            path = root_path / f"{split}.{side}"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            argv += [f"--{prefix}{side}-file", str(path)]
    data = root_path / "data"
    argv += ["--source-lang", "en", "--target-lang", "en", "--vocab-size", "16"]
    assert cli.main([*argv, "--model-type", "word", "--output", str(data)]) == 0
    torch.manual_seed(3)
    config = make_config("tiny", 16, model_type="at", init_std=0.5, dropout=0.0)
    ATModel(config).save_pretrained(root_path / "at", spm_model=data / "spm.model")
    return {"data": data, "at": root_path / "at"}


@pytest.fixture(scope="module")
def gen(tmp_path_factory) -> dict[str, Path]:
    return generated(str(tmp_path_factory.getbasetemp() / "distill-gen"))


def _files(directory: Path) -> dict[str, bytes]:
    return {
        f.name: f.read_bytes()
        for f in sorted(directory.iterdir())
        if f.is_file() and f.name != "meta.json"
    }


def _meta(directory: Path) -> dict:
    meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    del meta["distilled"]["seconds_this_run"], meta["distilled"]["finished"]
    del meta["distilled"]["sentences_per_second_this_run"]
    return meta


@pytest.fixture(scope="module")
def reference(gen, tmp_path_factory) -> Path:
    """An uninterrupted run (fadat engine, beam 3, batches of 16)."""
    out = tmp_path_factory.getbasetemp() / "distill-ref"
    return distill(
        gen["at"], gen["data"], out, beam=3, batch_size=16, engine="fadat", progress=False
    ).output


def test_targets_are_the_teachers_beam_outputs(gen, reference):
    teacher = ATModel.from_pretrained(gen["at"])
    source_data = BinarizedDataset(gen["data"], "train")
    kd = BinarizedDataset(reference, "train")
    assert len(kd) == len(source_data) == 300
    changed = 0
    for i in range(0, 300, 7):
        src, tgt = kd[i]
        assert src.tolist() == source_data[i][0].tolist()
        hyp = teacher.beam_search(torch.tensor([src.tolist()]), 3)[0].tokens
        # alone rather than in its batch: random-weight logits are far from ties
        assert tgt.tolist() == [BOS_ID, *hyp, EOS_ID]
        changed += tgt.tolist() != source_data[i][1].tolist()
    assert changed > 30
    for f in ("valid.src.ids.npy", "test.tgt.ids.npy", "spm.model", "raw/test.ref.txt"):
        assert (reference / f).read_bytes() == (gen["data"] / f).read_bytes()
    meta = json.loads((reference / "meta.json").read_text(encoding="utf-8"))
    settings = meta["distilled"]["settings"]
    assert settings["beam"] == 3 and settings["engine"] == "fadat"
    assert (
        settings["data_fingerprint"]
        == json.loads((gen["data"] / "meta.json").read_text())["fingerprint"]
    )
    assert meta["vocab_size"] == 16 and not (reference / PARTIAL).exists()
    # the train split's statistics describe the teacher's targets, not the references'
    train = meta["splits"]["train"]
    assert "target_words" not in train and "unk_tokens" not in train
    assert (
        train["source_words"]
        == json.loads((gen["data"] / "meta.json").read_text())["splits"]["train"]["source_words"]
    )
    assert train["target_tokens"]["max"] == int(
        BinarizedDataset(reference, "train").target_lengths.max()
    )
    BinarizedDataset(reference, "valid")  # the copied splits still load


def test_resume_after_stop_and_torn_line_gives_the_same_files(gen, reference, tmp_path, capsys):
    out = tmp_path / "kd"
    kwargs = dict(beam=3, batch_size=16, engine="fadat", progress=False)
    stopped = distill(gen["at"], gen["data"], out, stop_after=5, **kwargs)
    assert stopped == Distillation(out, complete=False)
    lines = (out / PARTIAL).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1 + 5 and not (out / "meta.json").exists()
    # The unfinished dataset is named as such where it is read (fadat train, evaluate, ...).
    with pytest.raises(InputError, match=f"{out}: distillation unfinished.*--output {out}"):
        read_meta(out)
    argv = ["train", "--data", str(out), "--run-dir", str(tmp_path / "run"), "--max-updates", "1"]
    assert cli.main(argv) == 2
    assert "distillation unfinished" in capsys.readouterr().err
    # A kill in the middle of a write leaves half a record after the last newline.
    with open(out / PARTIAL, "a", encoding="utf-8") as fh:
        fh.write('{"batch": 7, "targets": [[0, 5, 6')
    distill(gen["at"], gen["data"], out, stop_after=3, **kwargs)
    text = (out / PARTIAL).read_text(encoding="utf-8")
    assert text.endswith("\n") and len(text.splitlines()) == 1 + 8
    done = distill(gen["at"], gen["data"], out, **kwargs)
    assert (done.output, done.complete, done.reused) == (out, True, False)
    assert done.statistics is not None and done.statistics.pairs == 300
    assert _files(out) == _files(reference)
    assert _meta(out) == _meta(reference)
    # Once complete, a re-run does nothing.
    assert distill(gen["at"], gen["data"], out, **kwargs) == Distillation(
        out, True, reused=True, statistics=done.statistics
    )


def test_python_distill_checks_threads_and_locks_its_output(gen, tmp_path, monkeypatch, capsys):
    """What ``fadat distill`` checks around the work, :func:`distill` checks for a Python caller
    too: threads above the cores only with ``force`` (a ThreadsAboveCoresWarning then, printed
    by the command line only), and one writer per output
    (tests/test_sigkill_and_resume_gives_the_same_files runs the verb against the same
    reference)."""
    from fadat.errors import ThreadsAboveCoresWarning
    from fadat.outputs import output_lock

    out = tmp_path / "kd"
    kwargs = dict(beam=3, batch_size=16, engine="fadat", progress=False)
    monkeypatch.setattr("fadat.options.usable_cores", lambda: 1)
    with pytest.raises(InputError, match="--threads 2 is more than the 1 CPU core"):
        distill(gen["at"], gen["data"], out, threads=2, **kwargs)
    assert not out.exists()
    with output_lock(out), pytest.raises(InputError, match="another fadat process is writing"):
        distill(gen["at"], gen["data"], out, **kwargs)
    assert not out.exists()
    capsys.readouterr()
    with pytest.warns(ThreadsAboveCoresWarning, match="--threads 2 is more than the 1 CPU core"):
        distill(gen["at"], gen["data"], out, threads=2, force=True, stop_after=1, **kwargs)
    assert capsys.readouterr() == ("", "")
    assert len((out / PARTIAL).read_text(encoding="utf-8").splitlines()) == 1 + 1


def test_dataset_without_target_language_is_refused_before_translating(gen, tmp_path):
    """The statistics' BLEU tokenizes by the target language: a meta.json without it is an
    error before any sentence is translated (it used to be taken for English at the end)."""
    data = tmp_path / "data"
    shutil.copytree(gen["data"], data)
    meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
    del meta["target_lang"]
    (data / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    out = tmp_path / "kd"
    with pytest.raises(InputError, match=r"meta.json: no source_lang/target_lang"):
        distill(gen["at"], data, out, beam=3, batch_size=16, engine="fadat", progress=False)
    assert not (out / PARTIAL).exists()


def test_python_distill_prints_nothing_and_the_verb_prints_as_before(
    gen, reference, tmp_path, capsys
):
    """:func:`distill` returns what ``fadat distill`` prints (the dataset, and whether it was
    already there) and prints nothing itself; the verb prints ``wrote OUTPUT (N sentences, R
    sentences/s this run)``, after ``OUTPUT: already distilled with these settings`` when the
    output was a complete dataset of the same settings."""
    import shutil

    kwargs = dict(beam=3, batch_size=16, engine="fadat", progress=False)
    argv = ["distill", "--model", str(gen["at"]), "--data", str(gen["data"]), "--beam", "3"]
    argv += ["--batch-size", "16", "--engine", "fadat", "--no-progress-bar"]
    # Two copies of a run stopped before its last batch (19 batches of at most 16 sentences):
    # one finished from Python, one by the verb.
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    capsys.readouterr()
    assert distill(gen["at"], gen["data"], ours, stop_after=18, **kwargs).complete is False
    shutil.copytree(ours, theirs)
    first = distill(gen["at"], gen["data"], ours, **kwargs)
    assert (first.output, first.complete, first.reused) == (ours, True, False)
    assert distill(gen["at"], gen["data"], ours, **kwargs) == Distillation(
        ours, True, True, first.statistics
    )
    assert capsys.readouterr() == ("", "")
    assert _files(ours) == _files(reference)

    assert cli.main([*argv, "--output", str(theirs)]) == 0
    rate = read_meta(theirs)["distilled"]["sentences_per_second_this_run"]
    assert isinstance(rate, float) and rate > 0
    summary = first.statistics.summary()  # the statistics line (tests/test_distill_stats.py)
    assert capsys.readouterr() == (
        f"wrote {theirs} (300 sentences, {rate} sentences/s this run)\n{summary}\n",
        "",
    )
    assert _files(theirs) == _files(reference)
    # Complete already: the earlier run's numbers, after a line that says so.
    assert cli.main([*argv, "--output", str(theirs)]) == 0
    assert capsys.readouterr() == (
        f"{theirs}: already distilled with these settings\n"
        f"wrote {theirs} (300 sentences, {rate} sentences/s this run)\n{summary}\n",
        "",
    )


def test_sigkill_and_resume_gives_the_same_files(gen, reference, tmp_path):
    out = tmp_path / "kd"
    argv = [
        sys.executable,
        "-m",
        "fadat.cli",
        "distill",
        "--model",
        str(gen["at"]),
        "--data",
        str(gen["data"]),
        "--output",
        str(out),
        "--beam",
        "3",
        "--batch-size",
        "16",
        "--engine",
        "fadat",
        "--no-progress-bar",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        partial = out / PARTIAL
        if partial.is_file() and partial.read_bytes().count(b"\n") >= 4:
            break
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.skip("the run finished before it could be killed")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "meta.json").exists()
    done = proc.returncode
    assert done == -signal.SIGKILL
    rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert _files(out) == _files(reference)
    assert _meta(out) == _meta(reference)


def test_ctranslate2_engine_gives_the_same_targets(gen, reference, tmp_path):
    pytest.importorskip("ctranslate2")
    kwargs = dict(batch_size=16, progress=False)
    # Greedy: the same files, every sentence (most outputs of this random teacher run to the
    # length limit, where greedy is still exact).
    ours = distill(gen["at"], gen["data"], tmp_path / "g1", beam=1, engine="fadat", **kwargs)
    theirs = distill(
        gen["at"], gen["data"], tmp_path / "g2", beam=1, engine="ctranslate2", **kwargs
    )
    ours, theirs = ours.output, theirs.output
    assert _files(ours) == _files(theirs)
    assert not (theirs / "teacher-ctranslate2").exists()
    # Beam: not compared here. This random teacher puts much probability on <s> and <pad>,
    # which CTranslate2 removes before its softmax and fadat after (fadat.translation.export); the
    # beam comparison is tests/test_export.py's, on a trained model. The targets are well formed.
    theirs = distill(
        gen["at"], gen["data"], tmp_path / "b", beam=3, engine="ctranslate2", **kwargs
    ).output
    kd = BinarizedDataset(theirs, "train")
    assert len(kd) == 300 and all(
        kd[i][1][0] == BOS_ID and kd[i][1][-1] == EOS_ID for i in range(300)
    )
    assert read_meta(theirs)["distilled"]["settings"]["engine"] == "ctranslate2"


def test_vocabulary_mismatch_and_bad_teacher_are_clear_errors(gen, tmp_path, capsys):
    def run(model, out):
        code = cli.main(
            [
                "distill",
                "--model",
                str(model),
                "--data",
                str(gen["data"]),
                "--output",
                str(out),
                "--no-progress-bar",
                "--engine",
                "fadat",
            ]
        )
        return code, capsys.readouterr().err

    # Same vocabulary size, another sentencepiece model.
    other = tmp_path / "other"
    other.mkdir()
    cli.main(
        [
            "prepare",
            "--source-file",
            str(_write(tmp_path / "o.src", 5)),
            "--target-file",
            str(_write(tmp_path / "o.tgt", 6)),
            "--source-lang",
            "en",
            "--target-lang",
            "en",
            "--vocab-size",
            "16",
            "--model-type",
            "word",
            "--output",
            str(other / "data"),
        ]
    )
    capsys.readouterr()
    torch.manual_seed(0)
    at = ATModel(make_config("tiny", 16, model_type="at"))
    at.save_pretrained(other / "at", spm_model=other / "data" / "spm.model")
    code, err = run(other / "at", tmp_path / "kd")
    assert code == 2 and err.count("\n") == 1 and "spm.model" in err and "differs" in err, err

    # Another vocabulary size.
    ATModel(make_config("tiny", 20, model_type="at")).save_pretrained(other / "at20")
    code, err = run(other / "at20", tmp_path / "kd")
    assert code == 2 and err.count("\n") == 1 and "vocabulary size 20" in err, err

    # A DAT is no teacher.
    from fadat.models.dat import DATModel

    DATModel(make_config("tiny", 16)).save_pretrained(other / "dat")
    code, err = run(other / "dat", tmp_path / "kd")
    assert code == 2 and "'dat' model" in err
    assert not (tmp_path / "kd" / "meta.json").exists()

    # A partial file of other settings is refused, not mixed in.
    out = tmp_path / "kd2"
    distill(
        gen["at"],
        gen["data"],
        out,
        beam=3,
        batch_size=16,
        engine="fadat",
        progress=False,
        stop_after=1,
    )
    code, err = (
        cli.main(
            [
                "distill",
                "--model",
                str(gen["at"]),
                "--data",
                str(gen["data"]),
                "--output",
                str(out),
                "--beam",
                "2",
                "--batch-size",
                "16",
                "--engine",
                "fadat",
                "--no-progress-bar",
            ]
        ),
        capsys.readouterr().err,
    )
    assert code == 2 and "other settings" in err and PARTIAL in err


def test_max_pairs_distils_the_first_pairs_only(gen, reference, tmp_path, capsys):
    """``max_pairs``: a dataset of the first N training pairs with the teacher's targets (the
    full run's targets of those pairs), its count in meta.json and in the statistics, resumable
    like a full run; the valid and test splits the data's."""
    from fadat.evaluation.distillation import distillation_statistics

    kwargs = dict(beam=3, batch_size=16, engine="fadat", progress=False)
    out = tmp_path / "kd50"
    assert not distill(gen["at"], gen["data"], out, max_pairs=50, stop_after=2, **kwargs).complete
    done = distill(gen["at"], gen["data"], out, max_pairs=50, **kwargs)
    assert (done.complete, done.reused) == (True, False)
    kd, full, data = (BinarizedDataset(d, "train") for d in (out, reference, gen["data"]))
    assert len(kd) == 50
    for i in range(50):
        assert kd[i][0].tolist() == data[i][0].tolist()
        assert kd[i][1].tolist() == full[i][1].tolist()
    for f in ("valid.src.ids.npy", "test.tgt.ids.npy", "spm.model", "raw/test.ref.txt"):
        assert (out / f).read_bytes() == (gen["data"] / f).read_bytes()
    meta = read_meta(out)
    train = meta["splits"]["train"]
    assert train["pairs"] == 50 and "source_words" not in train and "unk_tokens" not in train
    assert train["source_tokens"] == {
        "mean": round(float(np.mean(kd.source_lengths)), 2),
        "max": int(kd.source_lengths.max()),
    }
    assert train["target_tokens"]["max"] == int(kd.target_lengths.max())
    assert meta["distilled"]["settings"]["max_pairs"] == 50
    assert meta["distilled"]["sentences"] == 50
    stats = done.statistics
    assert (stats.pairs, stats.source_pairs) == (50, 300)
    assert meta["distilled"]["statistics"] == stats.as_dict()
    assert distillation_statistics(gen["data"], out) == stats
    assert stats.summary().endswith("; the first 50 of 300 training pairs only")
    assert "first" not in distillation_statistics(gen["data"], reference).summary()
    # The same settings again: reused.
    assert distill(gen["at"], gen["data"], out, max_pairs=50, **kwargs).reused
    # Another N, or all pairs, into it: refused, saying what differs.
    with pytest.raises(
        InputError,
        match=r"complete dataset of other settings \(max_pairs: 50 "
        r"there, 60 here\); use another --output, or delete it",
    ):
        distill(gen["at"], gen["data"], out, max_pairs=60, **kwargs)
    argv = ["distill", "--model", str(gen["at"]), "--data", str(gen["data"]), "--beam", "3"]
    argv += ["--batch-size", "16", "--engine", "fadat", "--no-progress-bar", "--output", str(out)]
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(max_pairs: 50 there, all here)" in err, err
    # A partial run of another N is refused too, not mixed in.
    part = tmp_path / "part"
    distill(gen["at"], gen["data"], part, max_pairs=50, stop_after=1, **kwargs)
    with pytest.raises(
        InputError,
        match=rf"{PARTIAL}:1: written with other settings "
        r"\(max_pairs: 50 there, all here\)",
    ):
        distill(gen["at"], gen["data"], part, **kwargs)
    # The verb passes --max-pairs; out of range is an error before any translating.
    assert cli.main([*argv[:-1], str(tmp_path / "kd7"), "--max-pairs", "7"]) == 0
    assert len(BinarizedDataset(tmp_path / "kd7", "train")) == 7
    assert "the first 7 of 300 training pairs only" in capsys.readouterr().out
    with pytest.raises(InputError, match="--max-pairs must be 1 to the 300 training pairs"):
        distill(gen["at"], gen["data"], tmp_path / "kd301", max_pairs=301, **kwargs)
    assert not (tmp_path / "kd301" / PARTIAL).exists()
    capsys.readouterr()
    assert cli.main([*argv[:-1], str(tmp_path / "kd0"), "--max-pairs", "0"]) == 2
    assert "argument --max-pairs: must be >= 1" in capsys.readouterr().err


def _write(path: Path, seed: int) -> Path:
    """50 random sentences over other words than the generated dataset's."""
    lines = [line.upper() for line in random_sentences(50, seed=seed)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_distilled_split_has_consistent_arrays(reference):
    ids = np.load(reference / "train.tgt.ids.npy")
    off = np.load(reference / "train.tgt.off.npy")
    assert off[-1] == len(ids) and (ids[off[:-1]] == BOS_ID).all()
    assert (ids[off[1:] - 1] == EOS_ID).all()
