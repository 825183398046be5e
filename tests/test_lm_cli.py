"""The DAG beam search with a KenLM language model from the command line (``fadat translate`` /
``evaluate`` / ``serve`` ``--lm FILE --gamma γ``, fadat.translation.language_model) and the
LM's training text (``scripts/lm_corpus.py``): the command line's outputs against the decoder's
Python API on the same model, γ = 0 against no LM, a larger γ moving outputs toward what a
hand-written LM prefers, every refusal (exit 2, one line naming the file), and the corpus
script's round trip and all-or-nothing write. The LMs are tiny ARPA files written here (KenLM's
``lmplz`` is not needed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from test_evaluate import write_data
from test_translate import (
    _assert_one_error_line,
    _one_thread,  # noqa: F401  (autouse: the tiny models on one thread)
    random_sentences,
    run_cli,
)

from fadat import cli
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.data.spm import encode_source, load_sentencepiece
from fadat.decoding import decode
from fadat.engine.ngram import NgramModel
from fadat.errors import DecodingOptionError, InputError
from fadat.models.directory import load_model
from fadat.translation import language_model
from fadat.translation.pipeline import translate_lines

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "lm_corpus.py"

#: The word the hand-written LM prefers (a piece of the tiny models' word-level vocabulary).
FAVOURITE = "▁ab"


def _load_script():
    spec = importlib.util.spec_from_file_location("lm_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lm_corpus = _load_script()


def pieces(spm_path: Path) -> list[str]:
    sp = load_sentencepiece(spm_path)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def write_arpa(path: Path, words: list[str], favourite: str | None = FAVOURITE) -> Path:
    """A bigram ARPA LM over ``words`` (no special ones) that gives ``favourite`` log10
    probability −0.05 wherever it stands and every other word −2."""
    unigrams = [(-0.05 if w == favourite else -2.0, w) for w in words]
    lines = ["\\data\\", f"ngram 1={len(unigrams) + 3}", "ngram 2=2", "", "\\1-grams:"]
    lines += ["-3.0\t<unk>\t0", "-99\t<s>\t0", "-0.5\t</s>\t0"]
    lines += [f"{p}\t{w}\t0" for p, w in unigrams]
    lines += ["", "\\2-grams:", f"-0.05\t<s> {favourite}", f"-0.05\t{favourite} </s>", ""]
    path.write_text("\n".join([*lines, "\\end\\", ""]), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def arpa(models, tmp_path_factory) -> Path:
    """The tiny LM over the tiny models' pieces."""
    words = [w for w in pieces(models["spm"]) if not w.startswith("<")]
    return write_arpa(tmp_path_factory.mktemp("lm") / "pieces.arpa", words)


@pytest.fixture(scope="module")
def lines_file(tmp_path_factory) -> tuple[Path, list[str]]:
    lines = random_sentences(12, seed=41)
    path = tmp_path_factory.mktemp("input") / "in.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path, lines


def translate_cli(models, lines_file, capsys, monkeypatch, *extra: str) -> list[str]:
    """``fadat translate --strategy beam --print-scores`` of the input file; its output lines."""
    argv = ["translate", "--model", str(models["dat"]), "--input", str(lines_file[0])]
    code, out, err = run_cli(
        [*argv, "--strategy", "beam", "--print-scores", *extra], capsys, monkeypatch
    )
    assert code == 0, err
    return out.splitlines()


def expected_words(spm_path: Path) -> list[str]:
    """The LM word of each id as documented: the piece, ``<unk>`` for the four special ids."""
    words = pieces(spm_path)
    for i in (BOS_ID, PAD_ID, EOS_ID, UNK_ID):
        words[i] = "<unk>"
    return words


# ----------------------------------------------------------------------------------------------
# Decoding with an LM from the command line


def test_cli_beam_with_lm_equals_the_decoder_api(models, arpa, lines_file, capsys, monkeypatch):
    """``--lm FILE --gamma γ`` decodes as ``decode(..., "beam", lm=FILE, lm_words=pieces,
    gamma=γ)`` on the same model and sentences, each alone (``--max-tokens 1``)."""
    pytest.importorskip("kenlm")
    got = translate_cli(
        models,
        lines_file,
        capsys,
        monkeypatch,
        "--lm",
        str(arpa),
        "--gamma",
        "0.5",
        "--max-tokens",
        "1",
    )
    model, sp = load_model(models["dat"])
    assert language_model.lm_words(sp) == expected_words(models["spm"])
    want = []
    for line in lines_file[1]:
        source = torch.tensor([encode_source(sp, line)])  # (1, S)
        graph_lengths = model.graph_lengths(torch.tensor([source.shape[1]]), decoding=True)
        with torch.no_grad():
            token_logprobs, links = model(source, graph_lengths)
        hyp = decode(
            token_logprobs,
            links,
            graph_lengths,
            "beam",
            lm=str(arpa),
            lm_words=expected_words(models["spm"]),
            gamma=0.5,
        )[0]
        want.append(f"{hyp.score:.4f}\t{sp.decode(hyp.tokens)}")
    assert got == want
    without = translate_cli(models, lines_file, capsys, monkeypatch, "--max-tokens", "1")
    assert got != without  # the LM changed some output: the comparison above means something


def test_gamma_zero_is_no_lm(models, arpa, lines_file, capsys, monkeypatch):
    pytest.importorskip("kenlm")
    plain = translate_cli(models, lines_file, capsys, monkeypatch)
    zero = translate_cli(models, lines_file, capsys, monkeypatch, "--lm", str(arpa), "--gamma", "0")
    assert zero == plain
    default = translate_cli(models, lines_file, capsys, monkeypatch, "--lm", str(arpa))
    assert default != plain  # γ defaults to the beam search's 0.1, not 0


def _normalised_lm(lm, words: list[str], tokens: list[int]) -> float:
    """``lm(y) / max(1, |y|)^α`` (α = 1.1, the beam search's default): the LM's share of the
    beam search's objective."""
    score = lm.score(" ".join(words[t] for t in tokens), bos=True, eos=True)
    return score / max(1, len(tokens)) ** 1.1


def test_larger_gamma_moves_outputs_toward_the_lm(models, arpa, lines_file):
    """The LM prefers ``ab`` 100 to 1 over every other word: with a larger γ the outputs say
    ``ab`` more often and score better under the LM, sentence by sentence."""
    model, sp = load_model(models["dat"])
    options = language_model.language_model_options(arpa, model, sp)
    lm, words = options["lm"], options["lm_words"]
    runs = {}
    for gamma in (0.0, 2.0):
        hyps = translate_lines(
            model, sp, lines_file[1], strategy="beam", options={**options, "gamma": gamma}
        )
        runs[gamma] = [h[0].tokens for h in hyps]
    assert isinstance(lm, NgramModel)  # an ARPA file: its n-grams looked up in the search
    favourite = sp.piece_to_id(FAVOURITE)
    count = {g: sum(t.count(favourite) for t in out) for g, out in runs.items()}
    assert count[2.0] > count[0.0], count
    changed = 0
    for before, after in zip(runs[0.0], runs[2.0], strict=True):
        if before != after:
            changed += 1
            assert _normalised_lm(lm, words, after) > _normalised_lm(lm, words, before)
    assert changed >= 3


# ----------------------------------------------------------------------------------------------
# Refusals: exit 2, one line naming the file or the flag


def test_lm_file_missing_or_not_an_lm(models, tmp_path, capsys, monkeypatch):
    pytest.importorskip("kenlm")
    base = ["translate", "--model", str(models["dat"]), "--strategy", "beam", "--lm"]
    missing = tmp_path / "missing.arpa"
    code, _, err = run_cli([*base, str(missing)], capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(code, err, str(missing), "not found")
    text = tmp_path / "text.arpa"
    text.write_text("ab cd ef\n", encoding="utf-8")
    code, _, err = run_cli([*base, str(text)], capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(code, err, f"{text}:1: not an ARPA file", "ab cd ef", "--lm takes")
    code, _, err = run_cli([*base, str(tmp_path)], capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(code, err, str(tmp_path), "not a file")


def test_lm_of_words_is_refused(models, tmp_path, capsys, monkeypatch):
    """An LM of the words without the pieces' ``▁``: it would score every token as ``<unk>``."""
    pytest.importorskip("kenlm")
    words = [w.lstrip("▁") for w in pieces(models["spm"]) if not w.startswith("<")]
    path = write_arpa(tmp_path / "words.arpa", words, favourite=words[0])
    argv = ["translate", "--model", str(models["dat"]), "--strategy", "beam", "--lm", str(path)]
    code, _, err = run_cli(argv, capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(code, err, str(path), "only 0 of the model's 12", "trained on words")
    assert "scripts/lm_corpus.py" in err


def test_kenlm_not_installed(models, arpa, tmp_path, capsys, monkeypatch):
    """Runs with or without kenlm: its absence is simulated. An ARPA file is read by fadat
    itself; a KenLM binary file needs kenlm, and the refusal says so."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "kenlm" else find_spec(name, *a),
    )
    argv = ["translate", "--model", str(models["dat"]), "--strategy", "beam", "--lm", str(arpa)]
    code, out, err = run_cli(argv, capsys, monkeypatch, b"ab\n")
    assert code == 0, err
    assert out.strip()
    binary = tmp_path / "lm.bin"
    binary.write_bytes(b"mmap lm http://kheafield.com/code format version 5\n\0")
    argv[-1] = str(binary)
    code, _, err = run_cli(argv, capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(
        code,
        err,
        f"{binary}: a KenLM binary",
        "(--lm) needs the kenlm package",
        'pip install -e ".[lm]"',
    )


@pytest.mark.parametrize(
    ("model", "extra", "needles"),
    [
        ("dat", ["--lm", "{lm}"], ("--lm: strategy 'lookahead' takes no language model", "beam")),
        ("dat", ["--strategy", "viterbi", "--lm", "{lm}"], ("'viterbi' takes no language model",)),
        ("dat", ["--gamma", "1"], ("strategy 'lookahead' does not take --gamma",)),
        ("dat", ["--strategy", "beam", "--gamma", "1"], ("gamma (--gamma) weighs", "(--lm)")),
        ("at", ["--strategy", "beam", "--lm", "{lm}"], ("no strategy of this AT model takes one",)),
        ("at", ["--strategy", "beam", "--gamma", "1"], ("strategy 'beam' does not take --gamma",)),
    ],
)
def test_lm_and_gamma_only_with_the_dat_beam(
    models, arpa, capsys, monkeypatch, model, extra, needles
):
    """Refused before the LM is opened (``{lm}`` need not exist) and before any input is read."""
    argv = [
        "translate",
        "--model",
        str(models[model]),
        *(a.replace("{lm}", "missing.arpa") for a in extra),
    ]
    code, _, err = run_cli(argv, capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(code, err, *needles)


def test_python_api_refusals(models, arpa):
    model, sp = load_model(models["at"])
    with pytest.raises(DecodingOptionError, match="^lm: a language model is for"):
        language_model.check_takes_language_model(model, ["beam"])
    dat, sp = load_model(models["dat"])
    with pytest.raises(DecodingOptionError, match=r"strategy='beam'"):
        language_model.check_takes_language_model(dat, ["greedy", "lookahead"])
    with pytest.raises(InputError, match="gamma"):
        translate_lines(dat, sp, ["ab"], strategy="beam", options={"gamma": 0.5})


# ----------------------------------------------------------------------------------------------
# fadat evaluate and fadat serve


def test_evaluate_with_lm_decodes_as_translate(
    models, arpa, lines_file, tmp_path, capsys, monkeypatch
):
    pytest.importorskip("kenlm")
    data = write_data(tmp_path / "data", lines_file[1], [lines_file[1]])
    report = tmp_path / "report.json"
    argv = [
        "evaluate", "--model", str(models["dat"]), "--data", str(data),
        "--strategies", "lookahead,beam", "--lm", str(arpa), "--gamma", "0.5", "--no-latency",
        "--bootstrap", "0", "--threads", "1", "--report", str(report),
        "--save-hypotheses", str(tmp_path / "hyps"),
    ]  # fmt: skip
    code, _, err = run_cli(argv, capsys, monkeypatch)
    assert code == 0, err
    systems = {s["strategy"]: s for s in json.loads(report.read_text())["systems"]}
    assert systems["beam"]["options"] == {"lm": str(arpa), "gamma": 0.5}
    assert systems["lookahead"]["options"] == {}
    hyps = (tmp_path / "hyps" / "dat.beam.txt").read_text(encoding="utf-8").splitlines()
    translated = translate_cli(
        models, lines_file, capsys, monkeypatch, "--lm", str(arpa), "--gamma", "0.5"
    )
    assert hyps == [line.split("\t", 1)[1] for line in translated]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (
            ["--strategies", "lookahead", "--lm", "missing.arpa"],
            ("--lm: strategy 'lookahead' takes no language model", "(--strategies beam)"),
        ),
        (["--strategies", "lookahead,viterbi", "--gamma", "1"], ("--gamma: none of the systems",)),
        (
            ["--strategies", "lookahead", "--beta", "1", "--length-penalty", "2"],
            ("--length-penalty: none of the systems takes it", "dat:lookahead"),
        ),
        (["--strategies", "beam", "--gamma", "1"], ("gamma (--gamma) weighs",)),
    ],
)
def test_evaluate_refuses_options_no_system_takes(
    models, tmp_path, capsys, monkeypatch, extra, needles
):
    data = write_data(tmp_path / "data", ["ab cd"], [["ab cd"]])
    argv = [
        "evaluate",
        "--model",
        str(models["dat"]),
        "--data",
        str(data),
        "--report",
        str(tmp_path / "r.json"),
        *extra,
    ]
    code, _, err = run_cli(argv, capsys, monkeypatch)
    _assert_one_error_line(code, err, *needles)
    assert not (tmp_path / "r.json").exists()


def test_serve_engine_with_lm(models, arpa):
    """``fadat serve --lm``: beam requests may set γ and decode with the LM, as the translation
    core does with the same options; without an LM a request cannot set γ."""
    pytest.importorskip("kenlm")
    from fadat.serve.engine import Engine

    plain = Engine.from_directory(models["dat"])
    assert "gamma" not in plain.strategies["beam"]
    with pytest.raises(InputError, match="does not take 'gamma'"):
        plain.check("beam", {"gamma": 0.5})
    engine = Engine.from_directory(models["dat"], lm=arpa)
    assert "gamma" in engine.strategies["beam"] and "lm" not in engine.strategies["beam"]
    with pytest.raises(InputError, match=r"option 'gamma' must be in \[-10, 10\]"):
        engine.check("beam", {"gamma": 11})
    strategy, options = engine.check("beam", {"gamma": 0.5})
    assert options == {"gamma": 0.5}  # the LM is the server's, not the request's
    lines = random_sentences(6, seed=41)
    got = [r.text for r in engine.translate(lines, strategy, options)]
    lm_options = language_model.language_model_options(arpa, engine.model, engine.sp)
    want = translate_lines(
        engine.model, engine.sp, lines, strategy="beam", options={**lm_options, "gamma": 0.5}
    )
    assert got == [h[0].text for h in want]
    assert got != [r.text for r in plain.translate(lines, "beam", {})]
    with pytest.raises(DecodingOptionError, match="no strategy of this AT model"):
        Engine.from_directory(models["at"], lm=arpa)


# ----------------------------------------------------------------------------------------------
# scripts/lm_corpus.py


@pytest.fixture(scope="module")
def prepared(models, tmp_path_factory) -> tuple[Path, list[str]]:
    """A dataset prepared by ``fadat prepare`` in the tiny models' vocabulary; its train
    targets."""
    root = tmp_path_factory.mktemp("prepared")
    targets = random_sentences(30, seed=50)
    files = []
    for split, lines in (("train", targets), ("valid", random_sentences(4, seed=51))):
        for side, text in (("src", random_sentences(len(lines), seed=52)), ("tgt", lines)):
            path = root / f"{split}.{side}"
            path.write_text("".join(line + "\n" for line in text), encoding="utf-8")
            files.append(path)
    out = root / "data"
    argv = ["prepare", "--output", str(out), "--spm-model", str(models["spm"])]
    argv += ["--source-file", str(files[0]), "--target-file", str(files[1])]
    argv += ["--valid-source-file", str(files[2]), "--valid-target-file", str(files[3])]
    assert cli.main([*argv, "--source-lang", "en", "--target-lang", "es"]) == 0
    return out, targets


def test_lm_corpus_is_the_train_targets_as_pieces(prepared, tmp_path, capsys):
    data, targets = prepared
    output = tmp_path / "lm" / "lm.txt"
    assert lm_corpus.main(["--data", str(data), "--output", str(output)]) == 0
    assert "30 sentences" in capsys.readouterr().out
    lines = output.read_text(encoding="utf-8").splitlines()
    sp = load_sentencepiece(data / "spm.model")
    assert [sp.decode_pieces(line.split(" ")) for line in lines] == targets
    assert lines[0].split(" ") == sp.encode(targets[0], out_type=str)  # ▁ab ▁cd ...: pieces
    assert not any(w.startswith("<") for line in lines for w in line.split())
    assert list(output.parent.iterdir()) == [output]  # no temporary left
    assert lm_corpus.main(["--data", str(data), "--output", str(output), "--split", "valid"]) == 0
    assert len(output.read_text(encoding="utf-8").splitlines()) == 4  # replaced


def test_lm_corpus_all_or_nothing(prepared, tmp_path, monkeypatch, capsys):
    """An error half-way leaves no file, and an existing one as it was."""
    data, _ = prepared
    output = tmp_path / "lm.txt"
    calls = []

    def failing(sp, ids):
        calls.append(1)
        if len(calls) == 5:
            raise InputError("disk on fire")
        return "x"

    monkeypatch.setattr(lm_corpus, "lm_sentence", failing)
    assert lm_corpus.main(["--data", str(data), "--output", str(output)]) == 2
    assert "disk on fire" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    output.write_text("before\n", encoding="utf-8")
    calls.clear()
    assert lm_corpus.main(["--data", str(data), "--output", str(output)]) == 2
    assert output.read_text(encoding="utf-8") == "before\n"
    assert list(tmp_path.iterdir()) == [output]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--data", "{tmp}/nope"], ("nope/meta.json", "not found")),
        (["--data", "{data}", "--split", "test"], ("no split 'test'",)),
        (["--data", "{data}", "--output", "{data}/lm.txt"], ("lies inside the --data",)),
        (["--data", "{data}", "--output", "{tmp}"], ("is a directory",)),
    ],
)
def test_lm_corpus_errors(prepared, tmp_path, capsys, args, needles):
    data, _ = prepared
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{data}", str(data)) for a in args]
    if "--output" not in argv:
        argv += ["--output", str(tmp_path / "lm.txt")]
    assert lm_corpus.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lm_corpus: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    assert not (tmp_path / "lm.txt").exists()
