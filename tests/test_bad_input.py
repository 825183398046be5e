"""Every verb and the Python API against ordinary bad input, one mistake at a time: missing,
unreadable, binary or empty files, directories given for files and files for directories, YAML
errors (with line numbers), unknown keys, NaN / negative / out-of-range option values, damaged
model directories and wrong Python types. Each case must end in fadat's error type: for the CLI
exit 2 and one line on stderr that names the file/line/option and the problem (no traceback)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_translate import random_models, random_sentences

import fadat
from fadat import cli, outputs
from fadat.errors import InputError, NonFiniteOutputError
from fadat.outputs import MARKER

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """Good and bad inputs: a tiny DAT/AT model, a dataset, damaged model directories, files."""
    root = tmp_path_factory.mktemp("bad-input")
    models = random_models(str(tmp_path_factory.getbasetemp() / "random-models"))
    p: dict[str, Path] = {"dat": models["dat"], "at": models["at"], "root": root}
    text = root / "train.txt"
    text.write_text("\n".join(random_sentences(80, 7)) + "\n")
    data = root / "data"
    argv = ["prepare", "--source-file", str(text), "--target-file", str(text)]
    for split in ("valid", "test"):
        argv += [f"--{split}-source-file", str(text), f"--{split}-target-file", str(text)]
    argv += ["--source-lang", "en", "--target-lang", "en", "--vocab-size", "16"]
    assert cli.main([*argv, "--model-type", "word", "--output", str(data)]) == 0
    p.update(text=text, data=data)
    # Datasets whose raw text (read by evaluate, analyze and train's validation) is damaged.
    for name, file, line, bad in (
        ("latin1", "test.src.txt", 2, "ca\xf1on".encode("latin-1")),
        ("nul", "test.ref.txt", 3, b"ab\x00cd"),
        ("cr", "test.ref.txt", 1, b"ab\rcd"),
        ("validref", "valid.ref.txt", 2, "ca\xf1on".encode("latin-1")),
    ):
        copy = root / f"data-{name}"
        shutil.copytree(data, copy)
        lines = (copy / "raw" / file).read_bytes().split(b"\n")
        lines[line - 1] = bad
        (copy / "raw" / file).write_bytes(b"\n".join(lines))
        p[f"data-{name}"] = copy
    files = {
        "in": "ab cd\nef gh\n",
        "pairs": "ab cd\tef gh\n",
        "crtsv": "ab cd\tef gh\rab\tcd\ref\tgh\r",  # classic Mac OS line ends
        "one": "ab cd\n",
        "two": "ab\ncd\n",
        "empty": "",
        "badyaml": "lr: 0.001\n  oops: [\n",
        "tabyaml": "lr: 0.1\n\tx: 1\n",
        "unknown": "lr: 0.001\nnonsense_key: 1\n",
        "strlr": "lr: fast\n",
        "nanlr": "lr: .nan\n",
        "listyaml": "- lr\n- 0.1\n",
        "negmodel": "model:\n  d_model: -8\n",
        "unkmodel": "model:\n  colour: blue\n",
        "betas": "adam_betas: [0.9, 2]\n",
        "dupkey": "arch: dat\nlr: 0.001\narch: at\n",
        "dupnested": "model:\n  d_model: 16\n  d_model: 32\n",
        "dupspelling": "max_updates: 1\nmax-updates: 2\n",
        "neglr": "lr: -1\n",
        "nanlambda": "upsample_ratio: .nan\n",
        "modelnan": "model:\n  upsample_ratio: .nan\n",
        "ngram": "ngram_order: 3\n",
        "atglat": "arch: at\nglat_p: '0.3'\n",
        "hugemodel": "model:\n  d_model: 1000000000\n",
        "deepmodel": "model:\n  encoder_layers: 100000\n",
    }
    for name, content in files.items():
        p[name] = root / f"{name}.txt"
        p[name].write_text(content)
    p["bin"] = root / "binary.dat"
    p["bin"].write_bytes(bytes(range(256)) * 4)
    p["pickle"] = root / "object.pt"  # loads only with weights_only=False: never suggested
    torch.save({"format": "x", "obj": argparse.Namespace(a=1)}, p["pickle"])
    p["latin1"] = root / "latin1.txt"
    p["latin1"].write_bytes("ab cd\nca\xf1on\n".encode("latin-1"))
    p["dir"] = root / "a-directory"
    p["dir"].mkdir()
    p["inlink"] = root / "in-link.txt"  # the same file under other names
    p["inlink"].symlink_to(p["in"])
    p["inhard"] = root / "in-hard.txt"
    os.link(p["in"], p["inhard"])
    p["missing"] = root / "missing"
    # Damaged model directories.
    for name, damage in _DAMAGE.items():
        target = root / f"model-{name}"
        shutil.copytree(p["dat"], target)
        damage(target, p)
        p[f"m-{name}"] = target
    # Finite but extreme weights: loaded like any model, but the forward pass overflows fp32.
    for arch in ("dat", "at"):
        for name, scale in (("e15", 1e15), ("e30", 1e30)):
            target = root / f"model-{arch}-{name}"
            shutil.copytree(p[arch], target)
            _scale_weights(target, scale)
            p[f"{arch}-{name}"] = target
    return {k: str(v) for k, v in p.items()}


def _scale_weights(d: Path, scale: float) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(d / "model.safetensors"))
    state = {k: v * scale if v.is_floating_point() else v for k, v in state.items()}
    assert all(bool(torch.isfinite(v).all()) for v in state.values())  # finite in the file
    save_file(state, str(d / "model.safetensors"))


def _truncate(d: Path, p) -> None:
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _nan_weights(d: Path, p) -> None:
    # Same header, every data byte 0xff: NaN in float32. The header cannot tell.
    weights = d / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    raw[start:] = b"\xff" * (len(raw) - start)
    weights.write_bytes(bytes(raw))


def _int_weights(d: Path, p) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(d / "model.safetensors"))
    state = {k: v.to(torch.int32) for k, v in state.items()}
    save_file(state, str(d / "model.safetensors"))


def _foreign_spm(d: Path, p) -> None:
    """Another word-level sentencepiece model of the same size and special ids: every check but
    the fingerprint passes, and the output would be garbage."""
    from test_translate import train_sentencepiece

    train_sentencepiece(random_sentences(200, 3), d / "other", vocab_size=16, model_type="word")
    (d / "other.model").replace(d / "spm.model")
    (d / "other.vocab").unlink()


def _config(**changes):
    def damage(d: Path, p) -> None:
        meta = json.loads((d / "config.json").read_text())
        meta["config"].update(changes)
        (d / "config.json").write_text(json.dumps(meta))

    return damage


_DAMAGE = {
    "truncated": _truncate,
    "nan": _nan_weights,
    "int": _int_weights,
    "shapes": lambda d, p: shutil.copy(Path(p["at"]) / "model.safetensors", d),
    "nospm": lambda d, p: (d / "spm.model").unlink(),
    "badspm": lambda d, p: (d / "spm.model").write_text("not a model"),
    "noweights": lambda d, p: (d / "model.safetensors").unlink(),
    "noconfig": lambda d, p: (d / "config.json").unlink(),
    "cfgtext": lambda d, p: (d / "config.json").write_text("model_type = dat\n"),
    "cfgbinary": lambda d, p: (d / "config.json").write_bytes(bytes(range(128, 256))),
    "cfglist": lambda d, p: (d / "config.json").write_text("[1, 2]"),
    "cfgversion": lambda d, p: (d / "config.json").write_text(
        json.dumps({**json.loads((d / "config.json").read_text()), "format_version": 99})
    ),
    "vocab": _config(vocab_size=-5),
    "vocabtype": _config(vocab_size="many"),
    "dropout": _config(dropout=float("nan")),
    "nanlambda": _config(upsample_ratio=float("nan")),
    "strlambda": _config(upsample_ratio="4"),
    "cfgkey": _config(colour="blue"),
    # Sizes no CPU or GPU could hold: refused before any layer is allocated.
    "dmodel": _config(d_model=10**9),
    "vocabhuge": _config(vocab_size=10**10),
    "positions": _config(max_target_positions=10**12),
    "layers": _config(encoder_layers=100000),
    "params": _config(d_model=2**15, ffn_dim=2**17, attention_heads=2, link_heads=2),
    "strversion": lambda d, p: (d / "config.json").write_text(
        json.dumps({**json.loads((d / "config.json").read_text()), "format_version": "1"})
    ),
    "foreignspm": _foreign_spm,
}


def _fill(argv: list[str], paths: dict[str, str]) -> list[str]:
    return [a.format(**paths) for a in argv]


def check(argv: list[str], needles: tuple[str, ...], paths, capsys) -> None:
    code = cli.main(_fill(argv, paths))
    # fadat's warnings (e.g. bf16 on a CPU without bf16 hardware) are lines of their own
    err = "\n".join(
        line
        for line in capsys.readouterr().err.strip().splitlines()
        if not line.startswith("fadat: warning: ")
    )
    assert code == 2, f"exit {code}: {err}"
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fadat: error: "), err
    for needle in needles:
        assert needle.format(**paths) in err, err


def cases(verb_argv: list[str], table: list[tuple[list[str], tuple[str, ...]]]):
    return [
        pytest.param([*verb_argv, *argv], needles, id=" ".join(argv)[:60])
        for argv, needles in table
    ]


# ----------------------------------------------------------------------------------------------
# Model directories: the same loader behind translate, score, evaluate, analyze, show-graph,
# train --init-from.

MODEL_CASES = [
    (["{missing}"], ("{missing}", "does not exist")),
    (["{in}"], ("{in}", "a file, not a model directory")),
    (["{dir}"], ("config.json", "missing")),
    (["{m-truncated}"], ("model.safetensors", "cannot read weights")),
    (["{m-nan}"], ("model.safetensors", "NaN")),
    (["{m-int}"], ("model.safetensors", "torch.int32")),
    (["{m-shapes}"], ("model.safetensors", "do not match")),
    (["{m-nospm}"], ("spm.model", "missing")),
    (["{m-badspm}"], ("spm.model", "not a sentencepiece model")),
    (["{m-noweights}"], ("model.safetensors", "missing")),
    (["{m-noconfig}"], ("config.json", "missing")),
    (["{m-cfgtext}"], ("config.json", "not valid JSON")),
    (["{m-cfgbinary}"], ("config.json", "not valid JSON")),
    (["{m-cfglist}"], ("config.json", "expected a JSON object")),
    (["{m-cfgversion}"], ("config.json", "format_version 99")),
    (["{m-vocab}"], ("config.json", "vocab_size")),
    (["{m-vocabtype}"], ("config.json", "vocab_size")),
    (["{m-dropout}"], ("config.json", "dropout")),
    (["{m-nanlambda}"], ("config.json", "upsample_ratio", "finite")),
    (["{m-strlambda}"], ("config.json", "upsample_ratio", "'4'")),
    (["{m-cfgkey}"], ("config.json", "colour")),
    # Only translate and the Python API meet these (score, evaluate, ... take MODEL_CASES[:6]).
    (["{m-dmodel}"], ("config.json", "d_model must be <= 65536", "got 1000000000")),
    (["{m-vocabhuge}"], ("config.json", "vocab_size must be <= 16777216", "got 10000000000")),
    (["{m-positions}"], ("config.json", "max_target_positions must be <= 65536")),
    (["{m-layers}"], ("config.json", "encoder_layers must be <= 1024", "got 100000")),
    (["{m-params}"], ("config.json", "at least 2.58e+10 parameters", "1.72e+10 (64 GiB")),
    (["{m-strversion}"], ("config.json", "format_version must be an integer, got '1' (str)")),
    (["{m-foreignspm}"], ("spm.model", "not the sentencepiece model this model was saved with")),
]

#: What a model with finite but extreme weights ({dat-e30}: × 1e30) gets: its outputs overflow.
NON_FINITE_LINKS = ("model {dat-e30}", "non-finite link scores", "input line", "probably corrupt")
NON_FINITE_AT = ("model {at-e30}", "non-finite token log-probabilities", "input line", "corrupt")

#: What ``--threads 1000`` gets on any machine of today without --force.
THREADS_ABOVE_CORES = ("--threads 1000 is more than the", "CPU core", "give --force")

TRANSLATE_CASES = [
    *[(["--input", "{in}", "--model", *a], n) for a, n in MODEL_CASES],
    (["--model", "{dat}", "--input", "{missing}"], ("{missing}", "cannot read")),
    (["--model", "{dat}", "--input", "{dir}"], ("{dir}", "cannot read")),
    (["--model", "{dat}", "--input", "{bin}"], ("{bin}:1:", "NUL byte")),
    (["--model", "{dat}", "--input", "{latin1}"], ("{latin1}:2:", "invalid UTF-8")),
    (["--model", "{dat}", "--input", "{in}", "--output", "{dir}"], ("--output", "directory")),
    (["--model", "{dat}", "--input", "{in}", "--beta", "nan"], ("--beta", "finite")),
    (["--model", "{dat}", "--input", "{in}", "--beta", "fast"], ("--beta", "'fast'")),
    (["--model", "{dat}", "--input", "{in}", "--max-tokens", "-5"], ("--max-tokens", ">= 0")),
    (["--model", "{dat}", "--input", "{in}", "--threads", "-1"], ("--threads", ">= 0")),
    (["--model", "{dat}", "--input", "{in}", "--nbest", "0"], ("--nbest", ">= 1")),
    (["--model", "{dat}", "--input", "{in}", "--nbest", "3"], ("--nbest 3", "sample")),
    (
        ["--model", "{dat}", "--input", "{in}", "--nbest", "5000", "--strategy", "sample"],
        ("--nbest must be at most 1000",),
    ),
    (["--model", "{data}", "--input", "{in}"], ("config.json", "missing")),
    (["--model", "{dat}", "--input", "{in}", "--strategy", "nope"], ("'nope'", "choose")),
    (["--model", "{dat}", "--input", "{in}", "--strategy", "greedy", "--beta", "1"], ("--beta",)),
    (["--model", "{dat}", "--input", "{in}", "--strategy", "sample", "--top-p", "2"], ("top_p",)),
    (
        ["--model", "{dat}", "--input", "{in}", "--strategy", "sample", "--temperature", "-1"],
        ("--temperature", "> 0"),
    ),
    (
        ["--model", "{dat}", "--input", "{in}", "--strategy", "beam", "--beam-size", "0"],
        ("--beam-size", ">= 1"),
    ),
    (
        ["--model", "{dat}", "--input", "{in}", "--strategy", "viterbi", "--length-penalty", "inf"],
        ("--length-penalty", "finite"),
    ),
    (
        ["--model", "{dat}", "--input", "{in}", "--strategy", "viterbi", "--max-length", "-2"],
        ("--max-length", ">= 1"),
    ),
    (["--model", "{at}", "--input", "{in}", "--max-len-a", "nan"], ("--max-len-a", "finite")),
    (["--model", "{at}", "--input", "{in}", "--max-len-b", "-100"], ("--max-len-b", ">= 0")),
    (["--model", "{at}", "--input", "{in}", "--strategy", "sample"], ("'sample'", "AT")),
    (["--model", "{dat}", "--input", "{in}", "--device", "toaster"], ("toaster",)),
    (["--model", "{dat}", "--input", "{in}", "--nonsense"], ("--nonsense", "--help")),
    ([], ("--model", "required")),
    # Finite but extreme weights: every decoder, precision and architecture.
    *[
        (["--model", "{dat-e30}", "--input", "{in}", "--strategy", s], NON_FINITE_LINKS)
        for s in ("greedy", "lookahead", "viterbi", "joint-viterbi", "sample", "beam")
    ],
    (["--model", "{dat-e15}", "--input", "{in}"], NON_FINITE_LINKS[1:]),
    (
        ["--model", "{dat-e30}", "--input", "{in}", "--strategy", "sample", "--nbest", "3"],
        NON_FINITE_LINKS,
    ),
    (["--model", "{dat-e30}", "--input", "{in}", "--prune-threshold", "0.5"], NON_FINITE_LINKS),
    (["--model", "{dat-e30}", "--input", "{in}", "--precision", "bf16"], NON_FINITE_LINKS),
    *[
        (
            ["--model", f"{{dat-{name}}}", "--input", "{in}", "--precision", "int8"],
            (f"model {{dat-{name}}}", "non-finite activations (int8)", "lines 1, 2", "corrupt"),
        )
        for name in ("e15", "e30")
    ],
    *[
        (["--model", "{at-e30}", "--input", "{in}", "--strategy", s], NON_FINITE_AT)
        for s in ("greedy", "beam")
    ],
    (["--model", "{at-e15}", "--input", "{in}"], NON_FINITE_AT[1:]),
    # Numbers range-checked before they reach torch.
    (["--model", "{dat}", "--input", "{in}", "--threads", "99999999999"], ("at most 1024",)),
    (["--model", "{dat}", "--input", "{in}", "--threads", "1000"], THREADS_ABOVE_CORES),
    (
        ["--model", "{dat}", "--input", "{in}", "--strategy", "sample", "--seed", str(2**64)],
        ("--seed", f"at most {2**63 - 1}"),
    ),
    # Empty strings are named as such.
    (["--model", "{dat}", "--input", ""], ("--input is empty",)),
    (["--model", "{dat}", "--input", "{in}", "--output", ""], ("--output is empty",)),
    (["--model", "", "--input", "{in}"], ("--model is empty",)),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["translate"], TRANSLATE_CASES))
def test_translate(argv, needles, paths, capsys):
    check(argv, needles, paths, capsys)


SCORE_CASES = [
    *[(["--input", "{pairs}", "--model", *a], n) for a, n in MODEL_CASES[:6]],
    (["--model", "{dat}", "--input", "{in}"], ("{in}", "line 1", "SOURCE<TAB>TARGET")),
    (["--model", "{dat}", "--input", "{bin}"], ("{bin}", "NUL byte")),
    (["--model", "{dat}", "--input", "{dir}"], ("{dir}", "cannot read")),
    (["--model", "{dat}", "--source", "{one}", "--target", "{two}"], ("{one}", "{two}")),
    (["--model", "{dat}", "--source", "{one}"], ("--source", "--target")),
    (["--model", "{dat}", "--source", "{one}", "--target", "{missing}"], ("{missing}",)),
    (["--model", "{dat}", "--input", "{pairs}", "--max-tokens", "-1"], ("--max-tokens",)),
    (["--model", "{dat}", "--input", "{pairs}", "--output", "{dir}"], ("--output", "directory")),
    (["--model", "{dat-e30}", "--input", "{pairs}"], (*NON_FINITE_LINKS[:2], "input line 1:")),
    (["--model", "{dat-e15}", "--input", "{pairs}"], NON_FINITE_LINKS[1:]),
    (["--model", "{at-e30}", "--source", "{one}", "--target", "{one}"], NON_FINITE_AT),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["score"], SCORE_CASES))
def test_score(argv, needles, paths, capsys):
    check(argv, needles, paths, capsys)


PREPARE_BASE = ["--source-lang", "en", "--target-lang", "en", "--vocab-size", "16"]
PREPARE_CASES = [
    (["--source-file", "{missing}", "--target-file", "{in}"], ("{missing}", "No such file")),
    (["--source-file", "{dir}", "--target-file", "{in}"], ("{dir}", "cannot read")),
    (["--source-file", "{bin}", "--target-file", "{bin}"], ("{bin}:1", "NUL byte")),
    (["--source-file", "{latin1}", "--target-file", "{latin1}"], ("{latin1}:2", "UTF-8")),
    (["--source-file", "{empty}", "--target-file", "{empty}"], ("empty corpus",)),
    (["--source-file", "{text}", "--target-file", "{in}"], ("line counts differ", "{in}")),
    (["--source-file", "{text}"], ("--source-file and --target-file",)),
    (["--tsv", "{in}"], ("{in}:1", "tab-separated")),
    (["--tsv", "{crtsv}"], ("{crtsv}:1:", "carriage return without a line feed", "CR-only")),
    (["--tsv", "{text}", "--source-file", "{text}"], ("--tsv",)),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--vocab-size", "0"],
        ("--vocab-size",),
    ),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--max-source-positions", "1"],
        ("--max-source-positions", ">= 2"),
    ),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--max-target-positions", "-3"],
        ("--max-target-positions",),
    ),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--spm-model", "{dir}"],
        ("--spm-model", "directory"),
    ),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--spm-model", "{in}"],
        ("{in}", "not a sentencepiece model"),
    ),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--direction", "en-de"],
        ("--direction",),
    ),
    ([], ("no input",)),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--swap-prob", "0.5"],
        ("--swap-prob applies to synth-multimodal", "not to parallel text"),
    ),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--seed", "3"],
        ("--seed applies to synth-multimodal",),
    ),
    (
        ["--source-file", "{text}", "--target-file", "{text}", "--sword-dir", "{dir}"],
        ("--sword-dir applies to bible-en-es",),
    ),
    (["synth-multimodal", "--source-lang", "de"], ("--source-lang applies to parallel text",)),
    (["synth-multimodal", "--cache-dir", "{dir}"], ("--cache-dir applies to lohelp-en-de",)),
]


PARALLEL = ["--source-file", "{text}", "--target-file", "{text}", "--source-lang", "en"]
PARALLEL += ["--target-lang", "en", "--model-type", "word"]
#: Complete command lines (no PREPARE_BASE).
PREPARE_OWN_CASES = [
    (
        [*PARALLEL, "--model-type", "bpe", "--vocab-size", "6"],
        ("--vocab-size 6 is too small", "or more"),
    ),
    (
        [*PARALLEL, "--model-type", "bpe", "--vocab-size", "5000"],
        ("--vocab-size 5000 is too large", "or less"),
    ),
    (["synth-multimodal", "--seed", "-1"], ("--seed must be >= 0",)),
    (["bible-en-es", "--licence", "CC0"], ("--licence applies to parallel text",)),
    (["synth-multimodal", "--swap-prob", "nan"], ("--swap-prob must be in [0, 1]",)),
    (["synth-multimodal", "--vocab-size", "100"], ("--vocab-size", "do not apply")),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["prepare"], PREPARE_OWN_CASES))
def test_prepare_own(argv, needles, paths, capsys, tmp_path):
    check([*argv, "--output", str(tmp_path / "out")], needles, paths, capsys)
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize(("argv", "needles"), cases(["prepare"], PREPARE_CASES))
def test_prepare(argv, needles, paths, capsys, tmp_path):
    check([*argv, *PREPARE_BASE, "--output", str(tmp_path / "out")], needles, paths, capsys)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging directory left


TRAIN_BASE = ["--data", "{data}", "--preset", "tiny", "--max-updates", "1"]
TRAIN_CASES = [
    (["--config", "{missing}"], ("{missing}", "does not exist")),
    (["--config", "{dir}"], ("{dir}", "directory")),
    (["--config", "{bin}"], ("{bin}:1", "NUL byte")),
    (["--config", "{latin1}"], ("{latin1}:2", "UTF-8")),
    (["--config", "{badyaml}"], ("{badyaml}:2", "invalid YAML")),
    (["--config", "{tabyaml}"], ("{tabyaml}:2", "invalid YAML")),
    (["--config", "{listyaml}"], ("{listyaml}", "mapping")),
    (["--config", "{unknown}"], ("{unknown}", "nonsense_key")),
    (["--config", "{strlr}"], ("{strlr}", "lr", "'fast'")),
    (["--config", "{nanlr}"], ("{nanlr}", "lr", "finite")),
    (["--config", "{betas}"], ("{betas}", "adam_betas")),
    (["--config", "{negmodel}"], ("{negmodel}", "d_model")),
    (["--config", "{unkmodel}"], ("{unkmodel}", "colour")),
    (["--config", "{dupkey}"], ("{dupkey}:3", "duplicate key 'arch'", "first on line 1")),
    (["--config", "{dupnested}"], ("{dupnested}:3", "duplicate key 'd_model'")),
    (["--config", "{dupspelling}"], ("{dupspelling}", "max_updates", "twice")),
    (["--config", "{neglr}"], ("{neglr}: config key lr must be > 0", "got -1")),
    (["--config", "{nanlambda}"], ("{nanlambda}", "upsample_ratio", "finite")),
    (["--config", "{modelnan}"], ("{modelnan}", "upsample_ratio", "finite")),
    (["--config", "{ngram}"], ("{ngram}: config key ngram_order", "fuzzy", "not to 'nll'")),
    (["--config", "{atglat}"], ("{atglat}: config key glat_p", "does not glance")),
    (["--ngram-order", "3"], ("--ngram-order applies to the objective fuzzy", "'nll'")),
    (["--ngram-order", "2", "--arch", "at"], ("--ngram-order", "'label_smoothed_ce'")),
    (["--objective", "fuzzy", "--label-smoothing", "0.1"], ("--label-smoothing", "'fuzzy'")),
    (["--label-smoothing", "0.2"], ("--label-smoothing", "label_smoothed_ce", "'nll'")),
    (["--no-force-emit", "--arch", "at"], ("--no-force-emit applies", "--arch at")),
    (["--upsample-ratio", "2", "--arch", "at"], ("--upsample-ratio applies to --arch dat",)),
    (["--decode-beta", "2", "--arch", "at"], ("--decode-beta applies to --arch dat",)),
    (["--glat-p", "0.3", "--arch", "at"], ("--glat-p", "does not glance")),
    (["--upsample-ratio", "nan"], ("--upsample-ratio", "finite")),
    (["--lr", "nan"], ("lr", "finite")),
    (["--lr", "-1"], ("--lr", "> 0")),
    (["--lr", "fast"], ("--lr", "'fast'")),
    (["--dropout", "1.5"], ("--dropout",)),
    (["--warmup", "-1"], ("--warmup",)),
    (["--max-tokens", "0"], ("--max-tokens",)),
    (["--max-time", "soon"], ("'soon'", "duration")),
    (["--max-time", "-5"], ("'-5'",)),
    (["--glat-p", "lots"], ("--glat-p", "'lots'")),
    (["--update-freq", "0"], ("--update-freq",)),
    (["--clip-norm", "-1"], ("--clip-norm",)),
    (["--keep-best", "0"], ("--keep-best",)),
    (["--seed", "-1"], ("--seed must be >= 0", "got -1")),
    (["--threads", "-2"], ("--threads", ">= 0")),
    (["--preset", "huge"], ("'huge'", "preset")),
    (["--arch", "rnn"], ("--arch",)),
    (["--objective", "fuzzy", "--arch", "at"], ("'fuzzy'", "--arch at")),
    (["--bf16", "--fp16"], ("--bf16", "--fp16")),
    (["--init-from", "{in}"], ("{in}", "a file, not a model directory")),
    (["--init-from", "{m-nan}"], ("model.safetensors", "NaN")),
    (["--init-from", "{m-truncated}"], ("model.safetensors", "cannot read")),
    (["--init-from", "{at}"], ("--init-from", "'at'")),
    (["--data", "{in}"], ("--data", "a file")),
    (["--data", "{missing}"], ("{missing}", "does not exist")),
    (["--data", "{dir}"], ("meta.json",)),
    (["--seed", str(2**64)], ("--seed must be >= 0 and at most 9223372036854775807",)),
    (["--threads", "99999999999"], ("--threads", "at most 1024")),
    (["--threads", "1000"], THREADS_ABOVE_CORES),
    (["--config", "{hugemodel}"], ("{hugemodel}", "d_model must be <= 65536")),
    (["--config", "{deepmodel}"], ("{deepmodel}", "encoder_layers must be <= 1024")),
    (["--data", ""], ("--data is empty",)),
    (["--data", "{data-validref}"], ("raw/valid.ref.txt:2:", "invalid UTF-8")),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["train"], TRAIN_CASES))
def test_train(argv, needles, paths, capsys, tmp_path):
    run_dir = tmp_path / "run"
    check(["train", *TRAIN_BASE, "--run-dir", str(run_dir), *argv[1:]], needles, paths, capsys)


@pytest.mark.parametrize("how", ["nan-loss", "nan-sentences"])
def test_training_that_diverges_stops_and_keeps_the_last_good_checkpoint(
    how, paths, capsys, tmp_path, monkeypatch, caplog
):
    import fadat.training.trainer as train

    monkeypatch.setattr(train, "DIVERGED_UPDATES", 4)
    real = train.compute_loss
    calls = []

    def diverging(model, batch, cfg, objective=None):
        out = real(model, batch, cfg, objective)
        calls.append(1)
        if len(calls) <= 3:  # three good updates (update_freq 1: one call per update)
            return out
        if how == "nan-loss":
            return dataclasses.replace(out, loss_sum=out.loss_sum * float("nan"))
        # Every sentence non-finite: the objective counts them as 0, the logged loss is 0.0.
        n = float(out.stats["sentences"])
        stats = {**out.stats, "invalid_nonfinite": n}
        return dataclasses.replace(out, loss_sum=out.loss_sum * 0.0, stats=stats)

    monkeypatch.setattr(train, "compute_loss", diverging)
    run = tmp_path / "run"
    argv = ["train", "--data", "{data}", "--run-dir", str(run), "--preset", "tiny"]
    argv += ["--max-updates", "50", "--save-every", "1", "--validate-every", "0"]
    argv += ["--no-progress-bar", "--threads", "1"]
    with caplog.at_level("WARNING", logger="fadat.training.trainer"):
        check(
            argv,
            ("training diverged", "updates 4 to 7", "checkpoint_last.pt", "--lr"),
            paths,
            capsys,
        )
    assert "non-finite loss or gradient" in caplog.text  # warned at the first bad update
    from fadat.training.checkpoints import load_checkpoint

    state = load_checkpoint(run / "checkpoint_last.pt")
    assert state["progress"]["update"] == 3  # the last good one, not a diverged state
    assert all(
        bool(torch.isfinite(v).all()) for v in state["model"].values() if v.is_floating_point()
    )
    assert len(calls) == 7


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"lr": -1.0}, r"^TrainConfig\.lr must be > 0, got -1\.0$"),
        ({"objective_options": "fuzzy"}, r"^TrainConfig\.objective_options is FuzzyOptions, not"),
        ({"arch": "at", "upsample_ratio": 2.0}, r"^TrainConfig\.upsample_ratio applies to"),
        ({"seed": -4}, r"^TrainConfig\.seed must be >= 0"),
    ],
)
def test_train_python_api_names_fields(fields, match, paths, tmp_path):
    """train(TrainConfig(...)) from Python: messages name the dataclass fields, not flags."""
    from fadat.objectives.dat import FuzzyOptions
    from fadat.training.trainer import TrainConfig, train

    if fields.get("objective_options") == "fuzzy":  # the options of another objective
        fields = {"objective_options": FuzzyOptions(ngram_order=3)}
    cfg = TrainConfig(data=paths["data"], run_dir=str(tmp_path / "run"), max_updates=1, **fields)
    with pytest.raises(InputError, match=match):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_train_resume_cases(paths, capsys, tmp_path):
    check(["train", "--resume", "{missing}"], ("cannot resume",), paths, capsys)
    check(["train", "--resume", "{data}"], ("{data}", "cannot resume"), paths, capsys)
    check(["train", "--resume", "{in}"], ("{in}", "cannot resume"), paths, capsys)
    check(["train", "--resume", "{dir}", "--lr", "nan"], ("--lr", "finite"), paths, capsys)


AVERAGE_CASES = [
    (["--run", "{missing}"], ("--run", "does not exist")),
    (["--run", "{in}"], ("--run", "a file")),
    (["--run", "{dir}"], ("best.json", "does not exist")),
    (["--run", "{dir}", "--best", "0"], ("--best", ">= 1")),
    (["--checkpoints", "{missing}"], ("{missing}", "does not exist")),
    (["--checkpoints", "{dir}"], ("{dir}", "directory")),
    (["--checkpoints", "{bin}"], ("{bin}", "cannot read checkpoint")),
    (["--checkpoints", "{in}"], ("{in}", "cannot read checkpoint", "not a file written by torch")),
    (["--checkpoints", "{pickle}"], ("{pickle}", "Python objects other than tensors")),
    (["--checkpoints", "{dat}/model.safetensors"], ("model.safetensors", "not a file written")),
    (["--checkpoints", "{empty}"], ("{empty}", "cannot read checkpoint")),
    (["--run", "{dir}", "--checkpoints", "{in}"], ("exactly one",)),
    ([], ("exactly one",)),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["average"], AVERAGE_CASES))
def test_average(argv, needles, paths, capsys, tmp_path):
    check([*argv, "--output", str(tmp_path / "model")], needles, paths, capsys)
    assert not (tmp_path / "model").exists()


def _checkpoint(paths, path: Path, scale: float = 1.0) -> Path:
    """A training checkpoint holding the tiny DAT's weights times ``scale``."""
    from fadat.models.directory import load_pretrained
    from fadat.training.checkpoints import CHECKPOINT_FORMAT

    model = load_pretrained(paths["dat"])
    state = {k: v * scale if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save(
        {"format": CHECKPOINT_FORMAT, "model": state, "model_config": model.config.to_dict()},
        path,
    )
    return path


def test_average_replaces_a_model_only_with_force(paths, capsys, tmp_path):
    ckpt = str(_checkpoint(paths, tmp_path / "a.pt"))
    argv = ["average", "--checkpoints", ckpt, "--data", "{data}", "--output"]
    target = tmp_path / "model"
    shutil.copytree(paths["at"], target)
    (target / MARKER).unlink()  # a model written before the marker existed (the released one)
    before = (target / "model.safetensors").read_bytes()
    check([*argv, str(target)], ("--force",), paths, capsys)
    assert (target / "model.safetensors").read_bytes() == before
    (target / "README.md").write_text("model card of the old model\n")
    check([*argv, str(target), "--force"], ("README.md", "did not write"), paths, capsys)
    assert (target / "model.safetensors").read_bytes() == before
    (target / "README.md").unlink()
    assert cli.main(_fill([*argv, str(target), "--force"], paths)) == 0
    meta = json.loads((target / "config.json").read_text())
    assert meta["model_type"] == "dat" and meta["training"]["averaged"] == ["a.pt"]
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [MARKER, "config.json", "model.safetensors", "spm.model"]
    )
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_average_refuses_non_finite_and_unstorable_weights(paths, capsys, tmp_path):
    good = str(_checkpoint(paths, tmp_path / "good.pt"))
    bad = str(_checkpoint(paths, tmp_path / "nan.pt", float("nan")))
    argv = ["average", "--data", "{data}", "--output", str(tmp_path / "m"), "--checkpoints"]
    check([*argv, good, bad], ("nan.pt", "NaN or infinite"), paths, capsys)
    huge = str(_checkpoint(paths, tmp_path / "huge.pt", 1e6))
    check([*argv, huge, "--dtype", "float16"], ("do not fit in float16",), paths, capsys)
    assert not (tmp_path / "m").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _damage_record(path: Path, record: str = "data/0") -> str:
    """Flip one byte inside the data of ``path``'s zip record ending in ``record`` (a tensor of
    a torch.save file); returns the record's name. The archive stays readable: only the
    record's CRC-32 tells."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(record))
    raw = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack(
        "<HH", raw[info.header_offset + 26 : info.header_offset + 30]
    )
    start = info.header_offset + 30 + name_length + extra_length  # after the local header
    raw[start + 3] ^= 0x40
    path.write_bytes(bytes(raw))
    return info.filename


def test_average_refuses_a_checkpoint_that_fails_its_crc(paths, capsys, tmp_path):
    good = str(_checkpoint(paths, tmp_path / "good.pt"))
    bad = _checkpoint(paths, tmp_path / "bad.pt")
    record = _damage_record(bad)
    argv = ["average", "--data", "{data}", "--output", str(tmp_path / "m"), "--checkpoints"]
    check(
        [*argv, good, str(bad)],
        (f"{bad}: damaged checkpoint: record {record} fails its CRC",),
        paths,
        capsys,
    )
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def run_dir(paths, tmp_path_factory) -> Path:
    """A DAT run of two updates (checkpoint_last at update 2)."""
    run = tmp_path_factory.mktemp("run") / "run"
    argv = ["train", "--data", paths["data"], "--run-dir", str(run), "--preset", "tiny"]
    argv += ["--max-updates", "2", "--validate-every", "0", "--no-progress-bar", "--threads", "1"]
    assert cli.main(argv) == 0
    return run


def test_resume_checks_the_checkpoint(paths, run_dir, capsys, tmp_path):
    """A damaged checkpoint_last is named with its record, not resumed; NaN weights in a sound
    archive are named as damage, not blamed on the learning rate; an AT's checkpoint in a DAT
    run names the file and the run."""
    from fadat.models.directory import load_pretrained
    from fadat.training.checkpoints import load_checkpoint

    def copy(name: str) -> Path:
        run = tmp_path / name
        shutil.copytree(run_dir, run)
        return run

    resume = ["train", "--resume", "", "--max-updates", "3", "--no-progress-bar"]
    run = copy("crc")
    record = _damage_record(run / "checkpoint_last.pt")
    resume[2] = str(run)
    check(
        resume,
        (f"{run}/checkpoint_last.pt: damaged checkpoint: record {record} fails",),
        paths,
        capsys,
    )
    run = copy("nan")
    state = load_checkpoint(run / "checkpoint_last.pt")
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name] = state["model"][name] * float("nan")
    torch.save(state, run / "checkpoint_last.pt")
    resume[2] = str(run)
    check(resume, (f"{run}/checkpoint_last.pt: weight {name} holds NaN", "damaged"), paths, capsys)
    run = copy("at")
    at = load_pretrained(paths["at"])
    state = load_checkpoint(run / "checkpoint_last.pt")
    state.update(model=at.state_dict(), model_config=at.config.to_dict())
    torch.save(state, run / "checkpoint_last.pt")
    resume[2] = str(run)
    check(
        resume,
        (
            f"{run}/checkpoint_last.pt: a checkpoint of an 'at' model",
            f"the run {run} trains --arch dat",
        ),
        paths,
        capsys,
    )


def test_threads_above_the_cores_with_force_warn(paths, capsys, monkeypatch):
    """--force lets more threads than cores through, with a warning; --threads 1000 without it
    is refused (TRANSLATE_CASES)."""
    from fadat.options import usable_cores

    threads = usable_cores() + 1
    before = torch.get_num_threads()
    try:
        argv = ["translate", "--model", paths["dat"], "--input", paths["in"], "--force"]
        assert cli.main([*argv, "--threads", str(threads)]) == 0
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert err.startswith(f"fadat: warning: --threads {threads} is more than the"), err


def test_option_before_the_verb(paths, capsys):
    check(
        ["--threads", "1", "translate", "--model", "{dat}"],
        ("option --threads before the verb", "fadat translate --threads ..."),
        paths,
        capsys,
    )
    check(
        ["--device=cpu"], ("option --device before the verb", "fadat VERB OPTIONS"), paths, capsys
    )


def test_prepare_onto_a_dataset_with_garbage_meta_json(paths, capsys, tmp_path):
    """Named as unreadable, not as a dataset "built from different inputs"."""
    out = tmp_path / "data"
    shutil.copytree(paths["data"], out)
    (out / "meta.json").write_bytes(b"\x00garbage{")
    argv = ["prepare", *PREPARE_BASE, "--model-type", "word", "--source-file", "{text}"]
    argv += ["--target-file", "{text}", "--output", str(out)]
    check(argv, (f"--output {out}", "meta.json is unreadable", "--force"), paths, capsys)


def test_models_saved_before_the_spm_fingerprint_still_load(paths, tmp_path):
    """A model directory without ``spm_sha256`` (all saved before it) loads unchecked; a new one
    records the sha256 of its spm.model, and so does the committed one in models/ (added to its
    config.json afterwards)."""
    from fadat.data.build import sha256_file
    from fadat.models.directory import read_model_metadata

    assert read_model_metadata(paths["dat"])["spm_sha256"] == sha256_file(
        Path(paths["dat"]) / "spm.model"
    )
    committed = REPO / "models" / "bible-en-es-fadat-cpu-small"
    assert read_model_metadata(committed)["spm_sha256"] == sha256_file(committed / "spm.model")
    old = tmp_path / "old"
    shutil.copytree(paths["m-foreignspm"], old)
    meta = json.loads((old / "config.json").read_text())
    del meta["spm_sha256"]
    (old / "config.json").write_text(json.dumps(meta))
    assert isinstance(fadat.Translator.from_pretrained(old).translate("ab cd"), str)
    meta["spm_sha256"] = "not a digest"
    (old / "config.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="spm_sha256 must be 64 hex digits"):
        fadat.Translator.from_pretrained(old)


EVAL_BASE = ["--bootstrap", "0", "--no-latency", "--report"]
EVALUATE_CASES = [
    *[(["--data", "{data}", "--model", *a], n) for a, n in MODEL_CASES[:6]],
    (["--model", "{dat}", "--data", "{missing}"], ("{missing}", "meta.json")),
    (["--model", "{dat}", "--data", "{in}"], ("{in}",)),
    (["--model", "{dat}", "--data", "{data}", "--split", "train"], ("train",)),
    (["--model", "{dat}", "--data", "{data}", "--strategies", "nope"], ("'nope'",)),
    (["--model", "{dat}", "--data", "{data}", "--strategies", ","], ("--strategies",)),
    (["--model", "{dat}", "--data", "{data}", "--subset", "-4"], ("--subset", ">= 0")),
    (["--model", "{dat}", "--data", "{data}", "--at-beam-size", "0"], ("--at-beam-size",)),
    (["--model", "{dat}", "--data", "{data}", "--threads", "-1"], ("--threads",)),
    (["--model", "{dat}", "--data", "{data}", "--beta", "nan"], ("--beta", "finite")),
    (["--model", "{dat}", "--data", "{data}", "--length-penalty-grid", "1,x"], ("'x'",)),
    (["--model", "{dat}", "--data", "{data}", "--length-penalty-grid", ","], ("numbers",)),
    (["--model", "{dat}", "--data", "{data}", "--threads", "99999999999"], ("at most 1024",)),
    (["--model", "{dat}", "--data", "{data}", "--threads", "1000"], THREADS_ABOVE_CORES),
    # A prepared dataset's raw text is read as every text file is.
    (["--model", "{dat}", "--data", "{data-latin1}"], ("raw/test.src.txt:2:", "invalid UTF-8")),
    (["--model", "{dat}", "--data", "{data-nul}"], ("raw/test.ref.txt:3:", "NUL byte")),
    (["--model", "{dat}", "--data", "{data-cr}"], ("raw/test.ref.txt:1:", "carriage return")),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["evaluate"], EVALUATE_CASES))
def test_evaluate(argv, needles, paths, capsys, tmp_path):
    check(["evaluate", *EVAL_BASE, str(tmp_path / "r.json"), *argv[1:]], needles, paths, capsys)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("model", ["dat", "at"])
def test_evaluate_extreme_weights(model, paths, capsys, tmp_path):
    """Found while translating, after evaluate's progress lines: the error is the last line."""
    report = tmp_path / "r.json"
    argv = ["evaluate", *EVAL_BASE, str(report), "--model", f"{{{model}-e30}}", "--data", "{data}"]
    code = cli.main(_fill(argv, paths))
    last = capsys.readouterr().err.splitlines()[-1]
    needles = NON_FINITE_LINKS if model == "dat" else NON_FINITE_AT
    assert code == 2 and last.startswith("fadat: error: ")
    assert all(needle.format(**paths) in last for needle in needles), last
    assert "for input lines 1, 2, 3 and 61 more:" in last  # evaluate's first batch of 64 lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []


ANALYZE_CASES = [
    *[(["--data", "{data}", "--model", *a], n) for a, n in MODEL_CASES[:6]],
    (["--model", "{at}", "--data", "{data}"], ("AT model",)),
    (["--model", "{dat}", "--data", "{missing}"], ("{missing}",)),
    (["--model", "{dat}", "--data", "{data}", "--names", "a", "b"], ("--names",)),
    (["--model", "{dat}", "--data", "{data}", "--subset", "-1"], ("--subset",)),
    (["--model", "{dat}", "--data", "{data}", "--strategies", "nope"], ("'nope'",)),
    (["--model", "{dat}", "--data", "{data}", "--split", "nope"], ("nope",)),
    (["--model", "{dat-e30}", "--data", "{data}"], NON_FINITE_LINKS),
    (["--model", "{dat}", "--data", "{data-latin1}"], ("raw/test.src.txt:2:", "invalid UTF-8")),
    (["--model", "{dat}", "--data", "{data}", "--threads", "99999999999"], ("at most 1024",)),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["analyze"], ANALYZE_CASES))
def test_analyze(argv, needles, paths, capsys, tmp_path):
    check([*argv, "-o", str(tmp_path / "analysis")], needles, paths, capsys)
    assert not (tmp_path / "analysis").exists()


SHOW_GRAPH_CASES = [
    *[(["ab cd", "--model", *a], n) for a, n in MODEL_CASES[:6]],
    (["ab cd", "--model", "{at}"], ("AT model",)),
    (["", "--model", "{dat}"], ("empty",)),
    (["ab cd", "--model", "{dat}", "--top-k", "0"], ("--top-k", ">= 1")),
    (["ab cd", "--model", "{dat}", "--min-flow", "2"], ("--min-flow", "[0, 1]")),
    (["ab cd", "--model", "{dat}", "--min-passing", "nan"], ("--min-passing", "finite")),
    (["ab cd", "--model", "{dat}", "--strategy", "nope"], ("'nope'",)),
    (["ab cd", "--model", "{dat-e30}"], (*NON_FINITE_LINKS[:2], "input line 1:")),
    (["ab cd", "--model", "{dat}", "--top-k", "1000000"], ("--top-k", "at most 50")),
]


@pytest.mark.parametrize(("argv", "needles"), cases(["show-graph"], SHOW_GRAPH_CASES))
def test_show_graph(argv, needles, paths, capsys, tmp_path):
    check([*argv, "-o", str(tmp_path / "g.png")], needles, paths, capsys)
    assert not (tmp_path / "g.png").exists()


# ----------------------------------------------------------------------------------------------
# Outputs that would destroy inputs: refused before any work, whatever the verb, and every input
# byte-identical afterwards.

OVERLAP_CASES = [
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{in}"],
        ("--output {in}", "is the --input"),
    ),
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{inlink}"],
        ("--output {inlink}", "is the --input"),
    ),
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{inhard}"],
        ("--output {inhard}", "is the --input"),
    ),
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{dat}/model.safetensors"],
        ("lies inside the --model {dat}",),
    ),
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{dat}/out.txt"],
        ("lies inside the --model {dat}",),
    ),
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{data}/meta.json"],
        ("{data}/meta.json", "a file of the fadat dataset directory"),
    ),
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{at}/config.json"],
        ("{at}/config.json", "a file of the fadat model directory"),
    ),
    (
        ["score", "--model", "{dat}", "--input", "{pairs}", "--output", "{pairs}"],
        ("is the --input",),
    ),
    (
        [
            "score",
            "--model",
            "{dat}",
            "--source",
            "{one}",
            "--target",
            "{two}",
            "--output",
            "{two}",
        ],
        ("is the --target {two}",),
    ),
    (
        ["score", "--model", "{dat}", "--input", "{pairs}", "--output", "{dat}/spm.model"],
        ("lies inside the --model",),
    ),
    (
        ["evaluate", "--model", "{dat}", "--data", "{data}", "--report", "{data}/meta.json"],
        ("--report {data}/meta.json", "lies inside the --data"),
    ),
    (
        ["evaluate", "--model", "{dat}", "--data", "{data}", "--report", "{dat}/config.json"],
        ("--report {dat}/config.json", "lies inside the --model"),
    ),
    (
        ["evaluate", "--model", "{dat}", "--data", "{data}", "--save-hypotheses", "{data}/hyp"],
        ("--save-hypotheses", "lies inside the --data"),
    ),
    (
        ["analyze", "--model", "{dat}", "--data", "{data}", "-o", "{dat}/analysis"],
        ("--output-dir", "lies inside the --model"),
    ),
    (
        ["show-graph", "ab", "--model", "{dat}", "-o", "{dat}/graph.png"],
        ("lies inside the --model",),
    ),
    (["average", "--checkpoints", "{in}", "--output", "{dat}"], ("{dat}", "--force")),
    (
        ["average", "--checkpoints", "{in}", "--data", "{data}", "--output", "{data}/model"],
        ("lies inside the --data {data}",),
    ),
    (
        ["average", "--checkpoints", "{dir}/x.pt", "--output", "{dir}"],
        ("holds the --checkpoints",),
    ),
    (
        [
            "prepare",
            *PREPARE_BASE,
            "--source-file",
            "{text}",
            "--target-file",
            "{text}",
            "-o",
            "{text}",
        ],
        ("is the --source-file {text}",),
    ),
    (
        [
            "prepare",
            *PREPARE_BASE,
            "--tsv",
            "{pairs}",
            "--spm-model",
            "{dat}/spm.model",
            "-o",
            "{dat}",
        ],
        ("holds the --spm-model",),
    ),
    (
        [
            "prepare",
            *PREPARE_BASE,
            "--tsv",
            "{pairs}",
            "--valid-tsv",
            "{pairs}",
            "-o",
            "{data}/raw",
        ],
        ("{data}/raw", "did not create"),
    ),
    (["train", *TRAIN_BASE, "--run-dir", "{data}/run"], ("--run-dir", "inside the --data")),
    (
        ["train", *TRAIN_BASE, "--init-from", "{dat}", "--run-dir", "{dat}/run"],
        ("--run-dir", "inside the --init-from {dat}"),
    ),
    (["distill", "--model", "{at}", "--data", "{data}", "--output", "{data}"], ("is the --data",)),
    (
        ["distill", "--model", "{at}", "--data", "{data}", "--output", "{at}/kd"],
        ("lies inside the --model",),
    ),
]


OVERLAP_CASES += [
    (
        ["translate", "--model", "{dat}", "--input", "{in}", "--output", "{root}/./in.txt"],
        ("is the --input {in}",),
    ),
    (
        [
            "score",
            "--model",
            "{dat}",
            "--source",
            "{one}",
            "--target",
            "{two}",
            "--output",
            "{one}",
        ],
        ("is the --source {one}",),
    ),
    (
        ["score", "--model", "{dat}", "--input", "{pairs}", "--output", "{data}/spm.model"],
        ("{data}/spm.model", "a file of the fadat dataset directory {data}"),
    ),
    (
        ["show-graph", "ab", "--model", "{dat}", "-o", "{dat}/config.json"],
        ("lies inside the --model {dat}",),
    ),
    (
        [
            "prepare",
            "--tsv",
            "{pairs}",
            "--source-lang",
            "en",
            "--target-lang",
            "en",
            "-o",
            "{pairs}",
        ],
        ("is the --tsv {pairs}",),
    ),
    (
        [
            "prepare",
            "--tsv",
            "{pairs}",
            "--valid-tsv",
            "{pairs}",
            "--valid-extra-ref",
            "{in}",
            "--source-lang",
            "en",
            "--target-lang",
            "en",
            "-o",
            "{in}",
        ],
        ("is the --valid-extra-ref {in}",),
    ),
    (
        [
            "train",
            "--data",
            "{data}",
            "--init-encoder-from",
            "{at}",
            "--run-dir",
            "{at}/run",
            "--max-updates",
            "1",
        ],
        ("lies inside the --init-encoder-from {at}",),
    ),
    (["distill", "--model", "{at}", "--data", "{data}", "--output", "{at}"], ("is the --model",)),
    (
        ["export", "--format", "ctranslate2", "--model", "{at}", "--output", "{at}/ct2"],
        ("lies inside the --model {at}",),
    ),
    (["average", "--checkpoints", "{in}", "--output", "{data}"], ("a fadat dataset directory",)),
    (
        ["evaluate", "--model", "{dat}", "--data", "{data}", "--report", "{data}"],
        ("--report {data}", "is a directory"),
    ),
    (
        ["evaluate", "--model", "{dat}", "--data", "{data}", "--save-hypotheses", "{in}"],
        ("--save-hypotheses {in}", "not a directory"),
    ),
    (
        ["analyze", "--model", "{dat}", "--data", "{data}", "-o", "{in}"],
        ("--output-dir {in}", "not a directory"),
    ),
]


def _snapshot(paths: dict[str, str]) -> dict[str, str]:
    """sha256 of every file below the fixture's inputs (and the listing of their folders)."""
    found = {}
    for top in (paths["root"], paths["dat"], paths["at"]):
        for root, dirs, files in os.walk(top):
            for name in files + dirs:
                p = Path(root) / name
                found[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
    return found


@pytest.mark.parametrize(
    ("argv", "needles"),
    [pytest.param(a, n, id=" ".join(a)[:70]) for a, n in OVERLAP_CASES],
)
def test_output_never_overwrites_an_input(argv, needles, paths, capsys):
    before = _snapshot(paths)
    check(argv, needles, paths, capsys)
    assert _snapshot(paths) == before


# ----------------------------------------------------------------------------------------------
# I/O failures: disk full, a full or closed stdout, a directory that vanished, SIGTERM, two
# processes writing one output. One line naming the output and the OS error, exit 2, and nothing
# half-written or temporary left behind.

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


class _FullFile:
    """A text file on a device that fills up after ``room`` characters."""

    def __init__(self, real, room: int) -> None:
        self.real, self.room = real, room

    def write(self, text: str) -> int:
        if len(text) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(text)
        return self.real.write(text)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.real.close()

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("verb", ["translate", "score"])
def test_disk_full_while_writing_output(verb, paths, capsys, tmp_path, monkeypatch):
    import fadat.cli.common

    def full_open(*args, **kwargs):
        return _FullFile(open(*args, **kwargs), room=8)

    monkeypatch.setattr(fadat.cli.common, "open", full_open, raising=False)
    out = tmp_path / "out.txt"
    out.write_text("yesterday's output\n")
    source = "{in}" if verb == "translate" else "{pairs}"
    argv = [verb, "--model", "{dat}", "--input", source, "--output", str(out), "--force"]
    check(argv, (f"--output {out}", "No space left on device"), paths, capsys)
    assert out.read_text() == "yesterday's output\n"  # the old file stays whole
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("verb", ["translate", "score"])
def test_extreme_weights_leave_the_output_untouched(verb, paths, capsys, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("yesterday's output\n")
    source = "{in}" if verb == "translate" else "{pairs}"
    argv = [verb, "--model", "{dat-e30}", "--input", source, "--output", str(out), "--force"]
    check(argv, NON_FINITE_LINKS, paths, capsys)
    assert out.read_text() == "yesterday's output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize("beam", ["1", "3"])
def test_distill_with_extreme_weights(beam, paths, capsys, tmp_path):
    """The teacher's outputs overflow: one line naming it and the training pairs (numbered
    from 1; batches are longest first), exit 2."""
    teacher = tmp_path / "teacher"  # the dataset's tokenizer, as a real teacher has
    shutil.copytree(paths["at-e30"], teacher)
    shutil.copy(Path(paths["data"]) / "spm.model", teacher / "spm.model")
    meta = json.loads((teacher / "config.json").read_text())  # as if saved with it
    meta["spm_sha256"] = hashlib.sha256((teacher / "spm.model").read_bytes()).hexdigest()
    (teacher / "config.json").write_text(json.dumps(meta))
    argv = ["distill", "--model", str(teacher), "--data", "{data}", "--engine", "fadat"]
    argv += ["--output", str(tmp_path / "kd"), "--beam", beam, "--no-progress-bar"]
    needles = (f"model {teacher} produces non-finite token", "for input lines ", " and 61 more: ")
    check(argv, needles, paths, capsys)


def test_disk_full_while_saving_a_checkpoint(tmp_path, monkeypatch):
    import fadat.training.checkpoints as checkpoints

    path = tmp_path / "checkpoint_last.pt"
    checkpoints.atomic_save({"update": 1}, path)
    monkeypatch.setattr(
        checkpoints, "open", lambda *a, **k: _FullFile(open(*a, **k), room=100), raising=False
    )
    with pytest.raises(InputError, match=f"{path}: cannot write .No space left on device"):
        checkpoints.atomic_save({"update": 2, "weights": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"update": 1}  # the last good one stays
    assert _leftovers(tmp_path) == []


def test_disk_full_while_preparing(paths, capsys, tmp_path, monkeypatch):
    import fadat.data.prepare as prepare

    real_build = prepare.build

    def build_then_full(args, corpus, out):
        real_build(args, corpus, out)
        (out / "half-written.npy").write_bytes(b"\x93NUMPY")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "half-written.npy"))

    monkeypatch.setattr(prepare, "build", build_then_full)
    out = tmp_path / "data"
    argv = ["prepare", *PREPARE_BASE, "--model-type", "word", "--source-file", "{text}"]
    argv += ["--target-file", "{text}"]
    check([*argv, "-o", str(out)], (f"--output {out}", "No space left on device"), paths, capsys)
    assert list(tmp_path.iterdir()) == []  # no dataset, staging directory or lock


@pytest.mark.parametrize("verb", ["evaluate", "show-graph"])
def test_disk_full_while_writing_a_report(verb, paths, capsys, tmp_path, monkeypatch):
    real_replace = os.replace

    def full(src, dst, *args, **kwargs):
        if ".tmp-" in str(src):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(outputs.os, "replace", full)
    if verb == "evaluate":
        out = tmp_path / "r.json"
        argv = ["evaluate", "--model", "{dat}", "--data", "{data}", "--subset", "2"]
        argv += ["--strategies", "greedy", "--bootstrap", "0", "--no-latency", "--report"]
    else:
        out = tmp_path / "g.svg"
        argv = ["show-graph", "ab cd", "--model", "{dat}", "-o"]
    flag = "--report" if verb == "evaluate" else "--output"
    assert cli.main(_fill([*argv, str(out)], paths)) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after evaluate's progress lines
    assert last == f"fadat: error: {flag} {out}: cannot write (No space left on device)"
    assert list(tmp_path.iterdir()) == []


def test_output_directory_removed_during_translation(paths, capsys, tmp_path, monkeypatch):
    import fadat.cli.translate

    real = fadat.cli.translate.format_translations
    folder = tmp_path / "results"
    folder.mkdir()

    def remove_folder(*args, **kwargs):
        shutil.rmtree(folder, ignore_errors=True)
        return real(*args, **kwargs)

    monkeypatch.setattr(fadat.cli.translate, "format_translations", remove_folder)
    out = folder / "out.txt"
    argv = ["translate", "--model", "{dat}", "--input", "{in}", "--output", str(out)]
    check(argv, (f"--output {out}", "No such file or directory", "removed"), paths, capsys)
    assert list(tmp_path.iterdir()) == []


def test_sigterm_removes_the_temporary_and_the_next_run_removes_stale_ones(
    paths, capsys, tmp_path, monkeypatch
):
    import fadat.cli.translate

    real = fadat.cli.translate.format_translations

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(fadat.cli.translate, "format_translations", terminated)
    out = tmp_path / "out.txt"
    argv = ["translate", "--model", paths["dat"], "--input", paths["in"], "--output", str(out)]
    assert cli.main(argv) == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after the verb
    monkeypatch.undo()
    # A temporary of a killed process (SIGKILL: no cleanup) goes; a running process's stays.
    dead = tmp_path / f".out.txt.tmp-{2**22 + 7}-abc.txt"
    dead.write_text("half")
    running = tmp_path / f".out.txt.tmp-{os.getpid()}-def.txt"
    running.write_text("in progress")
    other = tmp_path / ".notes.tmp-1-x"
    other.write_text("not ours")
    assert cli.main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [running.name, other.name, "out.txt", outputs.RECORD]
    )
    assert len(out.read_text().splitlines()) == 2


def test_two_prepares_into_one_output(paths, capsys, tmp_path):
    out = tmp_path / "data"
    argv = ["prepare", *PREPARE_BASE, "--model-type", "word", "--source-file", "{text}"]
    argv += ["--target-file", "{text}"]
    with outputs.output_lock(out):  # another process building the same dataset
        check([*argv, "-o", str(out)], (f"--output {out}", "another fadat process"), paths, capsys)
        assert not out.exists()
    assert cli.main(_fill([*argv, "-o", str(out)], paths)) == 0
    assert outputs.output_kind(out) == "dataset"
    assert _leftovers(tmp_path) == []  # the lock file is gone too


def test_two_distills_into_one_output(paths, capsys, tmp_path):
    out = tmp_path / "kd"
    argv = ["distill", "--model", "{at}", "--data", "{data}", "--output", str(out)]
    with outputs.output_lock(out):
        check(argv, (f"--output {out}", "another fadat process"), paths, capsys)
    assert list(tmp_path.iterdir()) == []


def _cli(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "fadat.cli", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=300,
        **kwargs,
    )


def test_stdout_full_closed_or_a_closed_pipe(paths, tmp_path):
    argv = ["translate", "--model", paths["dat"], "--input", paths["text"]]
    with open("/dev/full", "w") as full:
        done = _cli(argv, stdout=full)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "fadat: error: <stdout>: cannot write (No space left on device)\n"
    # `fadat translate ... >&-`
    done = _cli(argv, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert (done.returncode, done.stderr) == (
        2,
        "fadat: error: stdout is closed; give --output FILE\n",
    )
    # `fadat translate ... | head -0`: the reading end is closed before the first line.
    read, write = os.pipe()
    os.close(read)
    try:
        done = _cli(argv, stdout=write)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")  # quiet, as for `yes | head`


def test_show_graph_output_suffix(paths, capsys, tmp_path):
    check(
        ["show-graph", "ab", "--model", "{dat}", "-o", str(tmp_path / "g.gif")],
        (".png",),
        paths,
        capsys,
    )


def test_unknown_verb_and_no_verb(paths, capsys):
    check(["translat"], ("'translat'", "--help"), paths, capsys)
    check([], ("VERB",), paths, capsys)


# ----------------------------------------------------------------------------------------------
# The Python API


@pytest.fixture(scope="module")
def translator(paths) -> fadat.Translator:
    return fadat.Translator.from_pretrained(paths["dat"])


def test_api_plain_string_is_one_sentence(translator):
    one = translator.translate("ab cd ef")
    assert isinstance(one, str)
    assert one == translator.translate(["ab cd ef"])[0]
    nbest = translator.translate_nbest("ab cd", 1)
    assert len(nbest) == 1 and nbest[0].text == translator.translate("ab cd")
    score = translator.score("ab cd", "ab cd")
    assert score == translator.score(["ab cd"], ["ab cd"])[0]
    assert translator.translate(("ab", "cd")) == translator.translate(["ab", "cd"])
    assert translator.translate(s for s in ["ab"]) == translator.translate(["ab"])


API_CASES = [
    ("translate", (None,), {}, "sentences must be a string or a sequence"),
    ("translate", (b"ab cd",), {}, "got bytes"),
    ("translate", (42,), {}, "got int"),
    ("translate", (["ab", 3],), {}, r"sentences\[1\] is a int"),
    ("translate", (["ab", None],), {}, r"sentences\[1\] is a NoneType"),
    ("translate", (["ab"],), {"strategy": 5}, "strategy must be a string"),
    ("translate", (["ab"],), {"strategy": "nope"}, "'nope'"),
    ("translate", (["ab"],), {"beta": "high"}, "option beta: expected a number"),
    ("translate", (["ab"],), {"beta": float("nan")}, "option beta"),
    ("translate", (["ab"],), {"beta": True}, "option beta"),
    ("translate", (["ab"],), {"colour": 1}, "does not take the keyword argument colour$"),
    ("translate", ({"text": "ab"},), {}, "got dict"),
    ("translate", ({"ab", "cd"},), {}, "got set"),
    ("translate_nbest", (["ab"], 2), {"strategy": "lookahead"}, "^strategy 'lookahead': nbest 2"),
    ("translate_nbest", (["ab"], 10**6), {"strategy": "sample"}, "nbest must be at most 1000"),
    ("translate", (["ab"],), {"max_tokens": -1}, "max_tokens"),
    ("translate", (["ab"],), {"max_tokens": "4096"}, "max_tokens"),
    ("translate", (["ab"], "sample"), {"top_p": 1.5}, "top_p"),
    ("translate", (["ab"], "sample"), {"seed": 1.5}, "option seed"),
    ("translate", (["ab"], "beam"), {"beam_size": 0}, "option beam_size"),
    ("translate_nbest", (["ab"], 0), {}, "nbest"),
    ("translate_nbest", (["ab"], "3"), {}, "nbest"),
    ("translate_nbest", (["ab"], 3), {}, "sample"),
    ("score", (["ab"], ["ab", "cd"]), {}, "1 source lines but 2 target lines"),
    ("score", ("ab", ["ab"]), {}, "both as strings or both as sequences"),
    ("score", ([1], ["ab"]), {}, r"sources\[0\]"),
    ("score", (["ab"], None), {}, "targets must be"),
    # Lone surrogates: not characters (sentencepiece failed on them with a traceback).
    ("translate", ("ab \udc80",), {}, r"^sentences: character 3 is a lone surrogate \(\\udc80\)"),
    ("translate", (["ab", "\ud800cd"],), {}, r"^sentences\[1\]: character 0 is a lone surrogate"),
    ("translate_nbest", ("\udfff", 2), {"strategy": "sample"}, "^sentences: .* lone surrogate"),
    ("score", (["ab"], ["c\udc80"]), {}, r"^targets\[0\]: character 1 is a lone surrogate"),
    ("score", ("\udc80", "ab"), {}, "^sources: character 0 is a lone surrogate"),
    ("translate", (["ab"], "sample"), {"seed": 2**64}, f"option seed: must be at most {2**63 - 1}"),
    ("translate", (["ab"],), {"beta": 10**400}, "option beta: expected a finite number"),
]


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "match"), API_CASES, ids=[f"{c[0]}-{c[3][:30]}" for c in API_CASES]
)
def test_api_wrong_types_and_values(translator, method, args, kwargs, match):
    with pytest.raises(InputError, match=match):
        getattr(translator, method)(*args, **kwargs)


def test_input_errors_are_value_errors(translator):
    """A Python caller's ``except ValueError`` catches fadat's bad-input errors."""
    assert issubclass(InputError, ValueError)
    with pytest.raises(ValueError, match="lone surrogate"):
        translator.translate("ab\udc80")


FROM_PRETRAINED_CASES = [
    (None, "directory must be a path"),
    ("{dat}|upsample_ratio=2", "upsample_ratio must be None or a finite number"),
    ("{dat}|upsample_ratio=nan", "upsample_ratio must be None or a finite number"),
    ("{dat}|device=0", "device must be a string"),
    ("{dat}|precision=0", "precision must be a string"),  # None: the default since the engines
    ("{m-nanlambda}", "config.json.*upsample_ratio.*finite"),
    (42, "directory must be a path"),
    ("{missing}", "does not exist"),
    ("{in}", "a file, not a model directory"),
    ("{m-nan}", "NaN"),
    ("{m-nospm}", "spm.model"),
    ("{dat}|upsample_ratio=huge", "upsample_ratio must be None or a finite number"),
    ("{dat}|precision=fp8", "^precision must be one of fp32, bf16, int8, got 'fp8'$"),
    ("{at}|precision=int8", "^precision='int8' is for DAT models on the CPU$"),
    ("{m-dmodel}", "config.json: invalid model config: d_model must be <= 65536"),
    ("{m-foreignspm}", "spm.model: not the sentencepiece model this model was saved with"),
]


@pytest.mark.parametrize(("directory", "match"), FROM_PRETRAINED_CASES)
def test_api_from_pretrained(paths, directory, match):
    kwargs = {}
    if isinstance(directory, str):
        directory, _, keyword = directory.format(**paths).partition("|")
        if keyword:  # one keyword argument of the wrong type or value
            name, value = keyword.split("=")
            values = {"2": "2", "nan": float("nan"), "0": 0, "None": None, "huge": 10**400}
            kwargs[name] = values.get(value, value)
    with pytest.raises(InputError, match=match):
        fadat.Translator.from_pretrained(directory, **kwargs)
    with pytest.raises(InputError, match="device"):
        fadat.Translator.from_pretrained(paths["dat"], device="toaster")


EXTREME_API_CASES = [
    ("dat-e30", "translate", (["ab cd", "ef"],), {}, "link scores for input lines 1, 2:"),
    ("dat-e30", "translate", ("ab cd",), {"strategy": "beam"}, "link scores for input line 1:"),
    ("dat-e15", "translate", ("ab cd",), {"strategy": "greedy"}, "link scores for input line 1:"),
    ("dat-e30", "translate_nbest", ("ab", 3), {"strategy": "sample"}, "link scores for input"),
    ("dat-e30", "score", (["ab", "cd"], ["ef", "gh"]), {}, "link scores for input lines 1, 2:"),
    ("dat-e30|int8", "translate", ("ab cd",), {}, r"activations \(int8\) for the batch of"),
    ("at-e30", "translate", ("ab cd",), {}, "token log-probabilities for input line 1:"),
    ("at-e30", "translate", ("ab",), {"strategy": "greedy"}, "token log-probabilities for input"),
    ("at-e30", "score", ("ab cd", "ef"), {}, "token log-probabilities for input line 1:"),
]


@pytest.mark.parametrize(
    ("model", "method", "args", "kwargs", "match"),
    EXTREME_API_CASES,
    ids=[f"{c[0]}-{c[1]}-{c[3].get('strategy', '')}" for c in EXTREME_API_CASES],
)
def test_api_extreme_weights(paths, model, method, args, kwargs, match):
    """A typed error (an InputError) naming the model directory and the input, not a decoder's
    ValueError from deep inside or NaN scores."""
    name, _, precision = model.partition("|")
    translator = fadat.Translator.from_pretrained(paths[name], precision=precision or "fp32")
    with pytest.raises(NonFiniteOutputError, match=match) as info:
        getattr(translator, method)(*args, **kwargs)
    assert isinstance(info.value, InputError)
    assert str(info.value).startswith(f"model {paths[name]} produces non-finite ")
    assert str(info.value).endswith(": its weights are probably corrupt")


@pytest.mark.parametrize("how", ["lookahead", "sample", "score", "analysis"])
def test_non_finite_outputs_name_the_input_line(paths, how, monkeypatch):
    """Only the graph of line 4 is poisoned (NaN in its links); the batch is sorted by length,
    and the error names line 4 alone."""
    from fadat.evaluation.analysis import model_outputs

    translator = fadat.Translator.from_pretrained(paths["dat"])
    model = translator.model
    lines = ["ab", "ab cd ef gh", "", "ab cd", "ab cd ef"]  # distinct lengths: distinct graphs
    poisoned = int(model.graph_lengths(torch.tensor([3]), decoding=True))  # "ab cd" </s>
    real = model.links_head.forward

    def forward(states, graph_lengths):
        links = real(states, graph_lengths)  # (B, L, L)
        links[graph_lengths == poisoned, 0, 1] = float("nan")
        return links

    monkeypatch.setattr(model.links_head, "forward", forward)
    with pytest.raises(NonFiniteOutputError, match="link scores for input line 4: its") as info:
        if how == "score":
            translator.score(lines, lines)
        elif how == "analysis":
            list(model_outputs(model, translator.sp, lines))
        else:
            translator.translate(lines, how)
    assert info.value.lines == [4]
    assert translator.translate(lines[:3] + lines[4:], how if how == "sample" else "lookahead")


def test_check_finite_allows_minus_inf_and_locates_rows():
    from fadat.models.architectures import check_finite

    ok = torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")], [-1.0, -2.0]])
    assert check_finite(ok, "x") is ok  # -inf: what cannot happen; all -inf rows too
    assert check_finite(torch.empty(0, 3), "x").numel() == 0
    for bad in (float("nan"), float("inf")):
        x = ok.clone()
        x[2, 1] = bad
        with pytest.raises(NonFiniteOutputError, match="^the model produces non-finite x for"):
            check_finite(x, "x")
        with pytest.raises(NonFiniteOutputError) as info:  # rows: a beam search's live sentences
            check_finite(x.to(torch.bfloat16).reshape(3, 1, 2), "x", rows=[7, 8, 9])
        assert info.value.rows == [9]
        assert str(info.value.located("m", list(range(1, 11)))) == (
            "model m produces non-finite x for input line 10: its weights are probably corrupt"
        )
    x = torch.full((5, 2), float("nan"))
    with pytest.raises(NonFiniteOutputError) as info:
        check_finite(x, "x")
    assert info.value.rows == [0, 1, 2, 3, 4]
    located = info.value.located(None, [3, 1, 2, 5, 4])
    assert located.lines == [1, 2, 3, 4, 5]
    assert str(located).startswith("the model produces non-finite x for input lines 1, 2, 3 and 2")


@pytest.mark.parametrize("arch", ["nat", "ctc"])
def test_nat_and_ctc_extreme_weights(arch):
    """The NAT's and CTC's batch methods check their log-probabilities too."""
    from test_baselines import tiny_config

    from fadat.models.architectures import model_class

    torch.manual_seed(0)
    model = model_class(arch)(tiny_config(arch)).eval()
    source = torch.tensor([[5, 6, 2], [7, 2, 1]])  # x </s>, right-padded
    target = torch.tensor([[0, 7, 2], [0, 2, 1]])
    with torch.inference_mode():
        assert model.translate_batch(source, "argmax", {})  # sound weights: no error
        for p in model.parameters():
            p.mul_(1e30)
        with pytest.raises(NonFiniteOutputError, match="non-finite .*log-probabilities"):
            model.translate_batch(source, "argmax", {})
        with pytest.raises(NonFiniteOutputError, match="non-finite .*log-probabilities"):
            model.score_batch(source, target, torch.tensor([3, 2]))


def test_case_counts():
    """The battery's size per verb (reported in the closing note); guards against a table
    losing its cases by accident. Outputs that would overwrite inputs (OVERLAP_CASES) count for
    their verb; the I/O-failure, divergence and average tests are added by hand."""
    overlap: dict[str, int] = {}
    for argv, _ in OVERLAP_CASES:
        overlap[argv[0]] = overlap.get(argv[0], 0) + 1
    counts = {
        # disk full, rmdir, SIGTERM, stdout, extreme weights with --output, --threads --force
        "translate": len(TRANSLATE_CASES) + overlap["translate"] + 6,
        "score": len(SCORE_CASES) + overlap["score"] + 2,
        "prepare": len(PREPARE_CASES) + len(PREPARE_OWN_CASES) + overlap["prepare"] + 3,
        # 2 divergence, checkpoint disk, resume of damaged checkpoints (3)
        "train": len(TRAIN_CASES) + 3 + overlap["train"] + 6,
        "average": len(AVERAGE_CASES) + overlap["average"] + 3,
        "evaluate": len(EVALUATE_CASES) + overlap["evaluate"] + 1 + 2,  # extreme weights
        "analyze": len(ANALYZE_CASES) + overlap["analyze"],
        "show-graph": len(SHOW_GRAPH_CASES) + 1 + overlap["show-graph"] + 1,
        "python API": len(API_CASES) + 2 * len(FROM_PRETRAINED_CASES) + 1 + 4 + 2,
        # finite but extreme weights: typed error, line attribution (4), check_finite, NAT/CTC (2)
        "python API, model outputs": len(EXTREME_API_CASES) + 4 + 1 + 2,
    }
    assert min(counts.values()) >= 10, counts
    extreme = {"translate": TRANSLATE_CASES, "score": SCORE_CASES, "analyze": ANALYZE_CASES}
    extreme["show-graph"] = SHOW_GRAPH_CASES
    for verb, table in extreme.items():  # every verb that runs a model meets a broken one
        assert any("non-finite" in " ".join(needles) for _, needles in table), verb
    assert overlap["distill"] >= 2 and overlap["export"] >= 1
