"""fadat.data.prepare.prepare from Python (no command line) and the corpus registry
(fadat.data.corpora): the same dataset as ``fadat prepare``, the flags derived from the records,
a corpus added by one record and one registry line."""

from __future__ import annotations

import argparse
import ast
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from fadat import cli
from fadat.data import corpora
from fadat.data.corpora import (
    CORPORA,
    PARALLEL_TEXT,
    REGISTRY,
    Corpus,
    CorpusOption,
    CorpusSpec,
    SplitText,
)
from fadat.data.prepare import prepare
from fadat.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
WORDS = "the cat dog sat on a mat and ran to house big small red blue green".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 9)))) for _ in range(n)]


@pytest.fixture
def pair(tmp_path: Path) -> dict[str, Path]:
    """Training text as two line-aligned files, valid as a TSV with an extra reference column,
    test as text files with an extra reference file."""
    src = sentences(120, 1)
    (tmp_path / "train.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (tmp_path / "train.xx").write_text("".join(s.upper() + "\n" for s in src), encoding="utf-8")
    rows = [f"{s}\t{s.upper()}\t{s.title()}\n" for s in sentences(15, 2)]
    (tmp_path / "valid.tsv").write_text("".join(rows), encoding="utf-8")
    test = sentences(12, 3)
    (tmp_path / "test.en").write_text("".join(s + "\n" for s in test), encoding="utf-8")
    (tmp_path / "test.xx").write_text("".join(s.upper() + "\n" for s in test), encoding="utf-8")
    (tmp_path / "test2.xx").write_text("".join(s.title() + "\n" for s in test), encoding="utf-8")
    return {p.name: p for p in tmp_path.iterdir()}


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_prepare_from_python_is_the_cli_dataset(pair, tmp_path, capsys):
    by_cli = tmp_path / "cli"
    argv = ["prepare", "--source-file", str(pair["train.en"]), "--target-file"]
    argv += [str(pair["train.xx"]), "--valid-tsv", str(pair["valid.tsv"])]
    argv += ["--test-source-file", str(pair["test.en"]), "--test-target-file"]
    argv += [str(pair["test.xx"]), "--test-extra-ref", str(pair["test2.xx"])]
    argv += ["--source-lang", "en", "--target-lang", "xx", "--vocab-size", "40"]
    argv += ["--max-target-positions", "16", "--chunk-pairs", "7", "--output", str(by_cli)]
    assert cli.main(argv) == 0
    capsys.readouterr()

    by_python = prepare(
        PARALLEL_TEXT,
        tmp_path / "py",
        source_file=pair["train.en"],  # a Path works as well as a str
        target_file=str(pair["train.xx"]),
        valid_tsv=pair["valid.tsv"],
        test_source_file=pair["test.en"],
        test_target_file=pair["test.xx"],
        test_extra_ref=[pair["test2.xx"]],
        source_lang="en",
        target_lang="xx",
        vocab_size=40,
        max_target_positions=16,
        threads=1,
    )
    assert by_python == tmp_path / "py"
    assert capsys.readouterr().out == ""  # progress goes to stderr only
    a, b = _files(by_cli), _files(by_python)
    assert sorted(a) == sorted(b)
    assert "raw/test.ref2.txt" in a and "raw/valid.ref2.txt" in a and "train.src.ids.npy" in a
    for name in a:
        if name != "meta.json":
            assert a[name] == b[name], name
    meta_cli, meta_py = json.loads(a["meta.json"]), json.loads(b["meta.json"])
    # chunk size and threads do not count; the timings differ
    assert meta_cli["fingerprint"] == meta_py["fingerprint"]
    assert meta_cli["dropped"]["too_long"]["count"] > 0  # the limit was passed on
    for key in ("seconds", "spm_seconds", "encode_seconds"):
        del meta_cli[key], meta_py[key]
    assert meta_cli == meta_py

    # Same inputs again: up to date, nothing rewritten; other options: refused without force.
    assert (
        prepare(
            PARALLEL_TEXT,
            by_cli,
            source_file=pair["train.en"],
            target_file=pair["train.xx"],
            valid_tsv=pair["valid.tsv"],
            test_source_file=pair["test.en"],
            test_target_file=pair["test.xx"],
            test_extra_ref=[pair["test2.xx"]],
            source_lang="en",
            target_lang="xx",
            vocab_size=40,
            max_target_positions=16,
        )
        == by_cli
    )
    assert _files(by_cli) == a
    with pytest.raises(InputError, match="built from different inputs or options"):
        prepare(
            PARALLEL_TEXT,
            by_cli,
            source_file=pair["train.en"],
            target_file=pair["train.xx"],
            source_lang="en",
            target_lang="xx",
            vocab_size=40,
        )


def test_prepare_refuses_with_the_cli_messages(pair, tmp_path, capsys):
    out = tmp_path / "out"
    text = {"source_file": pair["train.en"], "target_file": pair["train.xx"]}
    langs = {"source_lang": "en", "target_lang": "xx"}
    cases = [
        {"corpus": "synth-multimodal", **langs},
        {"corpus": PARALLEL_TEXT, **text, **langs, "seed": 3},
        {"corpus": PARALLEL_TEXT, **text, **langs, "direction": "en-xx"},
        {"corpus": "bible-en-es", "valid_tsv": pair["valid.tsv"]},
        {"corpus": PARALLEL_TEXT, **text, **langs, "vocab_size": 3},
        {"corpus": "synth-multimodal", "model_type": "word"},
        {"corpus": "synth-multimodal", "swap_prob": 1.5},
        {"corpus": PARALLEL_TEXT, **text},
    ]
    for kwargs in cases:
        corpus = kwargs.pop("corpus")
        with pytest.raises(InputError) as raised:
            prepare(corpus, out, **kwargs)
        # the command line of the same request says the same
        argv = [] if corpus == PARALLEL_TEXT else [corpus]
        for name, value in kwargs.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        assert cli.main(["prepare", *argv, "--output", str(out)]) == 2
        assert capsys.readouterr().err.strip() == f"fadat: error: {raised.value}"
    assert not out.exists()
    with pytest.raises(TypeError, match="unknown corpus option 'sourcefile'"):
        prepare(PARALLEL_TEXT, out, sourcefile="x", **langs)


def test_unknown_corpus_names_the_registered_ones(tmp_path):
    with pytest.raises(InputError) as raised:
        prepare("bible-en-de", tmp_path / "out")
    assert "unknown corpus 'bible-en-de'" in str(raised.value)
    for name in REGISTRY:
        assert name in str(raised.value)
    assert not (tmp_path / "out").exists()


def _prepare_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser("prepare")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["prepare"]


def test_every_corpus_has_the_flags_of_its_record():
    parser = _prepare_parser()
    actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    positional = next(a for a in parser._actions if a.dest == "corpus")
    assert list(positional.choices) == [n for n in REGISTRY if n != PARALLEL_TEXT]
    for name in REGISTRY:
        spec = CORPORA[name]
        assert spec.name == name and spec.help
        for option in spec.options:
            action = actions[option.flag]
            assert action.dest == option.name and action.help == option.help
            if option.repeatable:
                assert isinstance(action, argparse._AppendAction) and action.default == []
            else:
                assert action.default is None  # so that a flag left out is not passed on
                assert (action.type or str) is option.type
        # make takes every option, and where it declares a default it is the record's
        params = inspect.signature(spec.make).parameters
        inspect.signature(spec.make).bind(**spec.defaults())
        for option in spec.options:
            param = params.get(option.name)
            if param is not None and param.default is not inspect.Parameter.empty:
                assert param.default == option.default, (name, option.name)
        for generic in spec.excludes:
            assert f"--{generic.replace('_', '-')}" in actions


def test_synth_options_are_synthconfig_defaults():
    from fadat.data.synth import SynthConfig

    spec = CORPORA["synth-multimodal"]
    assert spec.defaults() == {k: getattr(SynthConfig(), k) for k in spec.option_names()}


def test_no_data_module_takes_an_argparse_namespace():
    """The command line is fadat.cli's: nothing under fadat/data imports argparse."""
    for path in sorted((ROOT / "fadat" / "data").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert "argparse" not in names, path.name
        assert "Namespace" not in path.read_text(encoding="utf-8"), path.name


# ----------------------------------------------------------------------------------------------
# A new corpus: one record and one registry line


def toy_corpus(pairs: int = 30, reverse: int = 0) -> Corpus:
    """Copy pairs over a six-word vocabulary (reversed targets with ``reverse``), one piece per
    word."""
    rng = np.random.default_rng(pairs)
    lines = [" ".join(rng.choice(WORDS[:6], size=4)) for _ in range(pairs)]
    targets = [" ".join(line.split()[::-1]) if reverse else line for line in lines]
    words = {w for line in lines for w in line.split()}
    return Corpus(
        name="toy",
        source_lang="aa",
        target_lang="aa",
        splits={"train": SplitText(lines, targets, [], [f"toy:{i}" for i in range(pairs)])},
        source_files=[],
        licence="none",
        attribution="tests",
        model_type="word",
        vocab_size=len(words) + 4,
    )


TOY = CorpusSpec(
    name="toy",
    help="copy pairs for the tests",
    make=toy_corpus,
    options=(
        CorpusOption("pairs", int, 30, "toy: training pairs (30)"),
        CorpusOption("reverse", int, 0, "toy: 1 reverses the targets"),
    ),
    inputs=lambda pairs, reverse: [],
    excludes=("vocab_size", "model_type", "spm_model"),
    excludes_reason="a word-level vocabulary of its own",
)


def test_a_registered_corpus_gets_flags_refusals_and_dispatch(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(REGISTRY, "toy", f"{__name__}:TOY")
    help_text = _prepare_parser().format_help()
    assert "toy:\n  --pairs PAIRS" in help_text and "{bible-en-es" in help_text
    assert "toy}" in help_text  # a choice of the corpus argument
    out = tmp_path / "toy"
    assert (
        cli.main(["prepare", "toy", "--pairs", "12", "--reverse", "1", "--output", str(out)]) == 0
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["corpus"] == "toy" and meta["splits"]["train"]["pairs"] == 12
    assert meta["vocab_size"] == toy_corpus(12).vocab_size  # the corpus's own vocabulary
    assert meta["spm"]["model_type"] == "word"
    # the same from Python: up to date (same fingerprint), nothing to do
    before = _files(out)
    assert prepare("toy", out, pairs=12, reverse=1) == out and _files(out) == before
    capsys.readouterr()
    for argv, message in [
        (["toy", "--seed", "3"], "--seed applies to synth-multimodal, not to toy"),
        (["--pairs", "3"], "--pairs applies to toy, not to parallel text (--source-file/"),
        (["toy", "--vocab-size", "50"], "toy has a word-level vocabulary of its own"),
        (["toy", "--source-file", "x"], "give either the built-in corpus toy or input files"),
    ]:
        assert cli.main(["prepare", *argv, "--output", str(tmp_path / "x")]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(InputError, match=r"lohelp-en-es, synth-multimodal, toy\) or --source"):
        corpora.parallel_text_corpus(source_lang="a", target_lang="b")
