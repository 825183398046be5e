"""The library entry points of ``fadat average``, ``shortlist``, ``export``, ``analyze`` and
``serve`` called from Python, without argparse: each writes what the verb writes on the same
input (the verb's module in fadat.cli only maps its flags onto them), and refuses bad keyword
values with the verb's messages before any work. ``fadat.translation.distill.distill``:
tests/test_distill.py."""

from __future__ import annotations

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
from test_translate import random_models, random_sentences

from fadat import cli
from fadat.errors import InputError, ThreadsAboveCoresWarning

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Random tiny DAT and AT model directories (:func:`test_translate.random_models`), a data
    directory holding their sentencepiece model, and parallel text in their vocabulary."""
    root = tmp_path_factory.mktemp("library-verbs")
    models = random_models(str(root / "random"))
    data = root / "data"
    data.mkdir()
    shutil.copyfile(models["spm"], data / "spm.model")
    src, tgt = root / "train.src", root / "train.tgt"
    src.write_text("ab cd ef\ngh ij\nab gh\ncd ef gh\n", encoding="utf-8")
    tgt.write_text("ab cd\ngh ij ef\nab\nef gh\n", encoding="utf-8")
    return {**models, "data": data, "src": src, "tgt": tgt, "root": root}


def _main(argv: list[str], capsys) -> str:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


# ----------------------------------------------------------------------------------------------
# average


def _checkpoint(model_dir: Path, path: Path, scale: float, bleu: float) -> Path:
    """A training checkpoint holding ``model_dir``'s weights times ``scale``."""
    from fadat.models.directory import load_pretrained
    from fadat.training.checkpoints import CHECKPOINT_FORMAT

    model = load_pretrained(model_dir)
    state = {k: v * scale if v.is_floating_point() else v for k, v in model.state_dict().items()}
    checkpoint = {"format": CHECKPOINT_FORMAT, "model": state, "bleu": bleu}
    torch.save({**checkpoint, "model_config": model.config.to_dict()}, path)
    return path


def _same_model(a: Path, b: Path) -> None:
    """Two model directories hold the same files, config and tensors (safetensors writes its
    metadata keys in no fixed order, so the weights file is compared by content)."""
    from safetensors import safe_open

    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for name in ("config.json", "spm.model"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    with (
        safe_open(a / "model.safetensors", "pt") as x,
        safe_open(b / "model.safetensors", "pt") as y,
    ):
        assert x.metadata() == y.metadata() and sorted(x.keys()) == sorted(y.keys())
        for key in x.keys():
            assert torch.equal(x.get_tensor(key), y.get_tensor(key)), key


def test_average_from_python_equals_the_verb(tiny, tmp_path, capsys):
    from fadat.models.directory import load_pretrained
    from fadat.training.average import average

    run = tmp_path / "run"
    run.mkdir()
    files, best = [], []
    for update, (scale, bleu) in enumerate(((1.0, 3.0), (0.5, 5.0), (3.0, 1.0)), start=1):
        files.append(_checkpoint(tiny["dat"], run / f"best_{update}.pt", scale, bleu))
        best.append({"file": files[-1].name, "bleu": bleu, "update": update})
    (run / "best.json").write_text(json.dumps({"checkpoints": best}))
    (run / "config.yaml").write_text(f"data: {tiny['data']}\n")

    # The run's two best (BLEU 5 and 3): weights 0.5·w and w, so their mean is 0.75·w.
    out = average(run, tmp_path / "py", best=2, dtype="float32")
    assert out == tmp_path / "py"
    argv = ["average", "--run", str(run), "--best", "2", "--output", str(tmp_path / "cli")]
    assert _main(argv, capsys) == f"averaged 2 checkpoints into {tmp_path / 'cli'}\n"
    _same_model(out, tmp_path / "cli")
    original = load_pretrained(tiny["dat"]).state_dict()
    averaged = load_pretrained(out).state_dict()
    for key, value in original.items():
        if value.is_floating_point():
            torch.testing.assert_close(averaged[key], 0.75 * value, rtol=1e-6, atol=1e-7)
    assert json.loads((out / "config.json").read_text())["training"]["averaged"] == [
        "best_2.pt",
        "best_1.pt",
    ]

    # Checkpoint files instead of a run, stored in float16.
    listed = [str(f) for f in files[:2]]
    out = average(listed, tmp_path / "py16", data=tiny["data"], dtype="float16")
    argv = ["average", "--checkpoints", *listed, "--data", str(tiny["data"]), "--dtype", "float16"]
    _main([*argv, "--output", str(tmp_path / "cli16")], capsys)
    _same_model(out, tmp_path / "cli16")

    # The verb's checks, before any checkpoint is read.
    with pytest.raises(InputError, match="an existing model directory; pass --force"):
        average(run, out, best=2)
    assert average(run, out, best=2, force=True) == out  # replaced as a whole
    for kwargs, message in (
        ({"best": 0}, "--best must be >= 1"),
        ({"dtype": "int8"}, "dtype must be one of float32, float16, bfloat16, got 'int8'"),
    ):
        with pytest.raises(InputError, match=message):
            average(run, tmp_path / "none", **kwargs)
    with pytest.raises(InputError, match="no checkpoints to average"):
        average([], tmp_path / "none")
    with pytest.raises(InputError, match="lies inside the --run"):
        average(run, run / "model", best=2)
    assert not (tmp_path / "none").exists()


# ----------------------------------------------------------------------------------------------
# shortlist


def test_shortlist_from_python_equals_the_verb(tiny, tmp_path, capsys):
    from fadat.models.shortlist import SHORTLIST_NAME, load_shortlist, shortlist

    text = {"source": tiny["src"], "target": tiny["tgt"], "top_k": 2, "frequent": 1}
    out = shortlist(tiny["dat"], None, tmp_path / "py.safetensors", **text)
    assert out == tmp_path / "py.safetensors"
    argv = ["shortlist", "--model", str(tiny["dat"]), "--source", str(tiny["src"])]
    argv += ["--target", str(tiny["tgt"]), "--top-k", "2", "--frequent", "1"]
    printed = _main([*argv, "--output", str(tmp_path / "cli.safetensors")], capsys)
    summary = {"pairs": "4", "top_k": "2", "frequent": "1"}
    assert printed == f"wrote {tmp_path / 'cli.safetensors'}: {json.dumps(summary)}\n"
    ours, theirs = load_shortlist(out, 16), load_shortlist(tmp_path / "cli.safetensors", 16)
    assert np.array_equal(ours.table, theirs.table)
    assert np.array_equal(ours.frequent, theirs.frequent)
    assert ours.metadata == theirs.metadata and ours.metadata["pairs"] == "4"

    # By default into the model directory, which then names it as its own file.
    model = tmp_path / "dat"
    shutil.copytree(tiny["dat"], model)
    written = shortlist(model, **text)
    assert written == model / SHORTLIST_NAME
    assert np.array_equal(load_shortlist(model, 16).table, ours.table)
    # an existing --output file that fadat did not write needs force
    (tmp_path / "mine.safetensors").write_bytes(b"my own file")
    with pytest.raises(InputError, match="did not write"):
        shortlist(tiny["dat"], None, tmp_path / "mine.safetensors", **text)
    shortlist(tiny["dat"], None, tmp_path / "mine.safetensors", force=True, **text)
    assert load_shortlist(tmp_path / "mine.safetensors", 16).metadata == ours.metadata

    for kwargs, message in (
        ({}, "give either --data DIR or --source FILE --target FILE"),
        ({"source": tiny["src"]}, "--source and --target go together"),
        ({**text, "top_k": -1}, "top_k and frequent must be >= 0"),
    ):
        with pytest.raises(InputError, match=message):
            shortlist(tiny["dat"], None, tmp_path / "none.safetensors", **kwargs)
    assert not (tmp_path / "none.safetensors").exists()


# ----------------------------------------------------------------------------------------------
# export


def _quiet_in_its_own_process(argv: list[str]) -> str:
    """``fadat export`` in a process of its own (the exporters' logging and warnings reach the
    terminal there, not pytest's capture): exit 0, one ``exported ...`` line, nothing on
    stderr. Returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "fadat.cli", *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("exported ") and done.stdout.count("\n") == 1, done.stdout
    return done.stdout


def test_export_ctranslate2_from_python_equals_the_verb(tiny, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from fadat.models.shortlist import shortlist
    from fadat.translation.export import export

    model = tmp_path / "at"
    shutil.copytree(tiny["at"], model)
    shortlist(model, source=tiny["src"], target=tiny["tgt"], top_k=2, frequent=1)
    out = export(model, tmp_path / "py", format="ctranslate2", shortlist=True)
    assert out == tmp_path / "py"
    argv = ["export", "--format", "ctranslate2", "--model", str(model), "--shortlist"]
    printed = _main([*argv, "--output", str(tmp_path / "cli")], capsys)
    assert printed.endswith("(ctranslate2, float32, vmap.txt from the shortlist)\n")
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "cli").iterdir())
    _quiet_in_its_own_process([*argv, "--output", str(tmp_path / "sub")])
    assert "vmap.txt" in names and "model.bin" in names
    for name in names:
        ours, theirs = (out / name).read_bytes(), (tmp_path / "cli" / name).read_bytes()
        if name.endswith(".json"):  # the shortlist's metadata keys come in no fixed order
            ours, theirs = json.loads(ours), json.loads(theirs)
        assert ours == theirs, name

    for kwargs, message in (
        ({"format": "ctranslate2", "precision": "int8"}, "--precision is for --format onnx"),
        ({"format": "onnx", "shortlist": True}, "'at' model; the onnx engine is for DAT"),
        ({"format": "onnx", "quantization": "int8"}, "--quantization is for --format ct"),
        ({"format": "tflite"}, "format must be one of ctranslate2, onnx, got 'tflite'"),
        ({"format": "ctranslate2", "attention": "standard"}, "--attention is for --format onnx"),
        ({"format": "onnx", "attention": "flash"}, "attention must be one of fused, standard"),
        ({"format": "ctranslate2", "top_k": 3}, "--top-k is for --format onnx"),
    ):
        with pytest.raises(InputError, match=message):
            export(model, tmp_path / "none", **kwargs)
    with pytest.raises(InputError, match="pass --force"):
        export(model, out, format="ctranslate2")
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_export_onnx_from_python_equals_the_verb(dat_onnx, tmp_path):
    """The Python verb's export of a tiny random DAT (the test run's, conftest.dat_onnx: an
    ONNX export takes ≈ 20 s of CPU time) against ``fadat export --format onnx`` of the same
    model directory, run in a process of its own (which also checks that it prints one line and
    nothing on stderr)."""
    from fadat.engine.runtime import OnnxDAT

    out, dat = dat_onnx["dir"] / "fp32", dat_onnx["dat"]
    argv = ["export", "--format", "onnx", "--model", str(dat)]
    printed = _quiet_in_its_own_process([*argv, "--output", str(tmp_path / "cli")])
    what = "onnx, fp32, fused attention, top 5 tokens per vertex"
    assert printed == f"exported {dat} to {tmp_path / 'cli'} ({what})\n"
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "cli").iterdir())
    for name in names:
        if name != "dat.onnx":
            assert (out / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    # The graphs compute the same numbers (their bytes may differ in the exporter's names).
    source = np.array([[5, 6, 7, 2], [8, 9, 2, 1]], dtype=np.int64)  # x </s>, PAD-padded
    ours, theirs = OnnxDAT(out), OnnxDAT(tmp_path / "cli")
    for a, b in zip(ours.run(source), theirs.run(source), strict=True):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------
# analyze


@pytest.fixture(scope="module")
def tiny_dataset(tiny) -> Path:
    """A ``fadat prepare``d dataset over the tiny models' words (test split of 6 pairs, sources
    short enough for their 8 source positions)."""
    root = tiny["root"] / "prepared"
    root.mkdir()
    argv = ["prepare"]
    for k, (split, n) in enumerate((("train", 60), ("test", 6))):
        prefix = "" if split == "train" else f"{split}-"
        for side, seed in (("source", 10 + k), ("target", 20 + k)):
            path = root / f"{split}.{side}"
            path.write_text("\n".join(random_sentences(n, seed)) + "\n", encoding="utf-8")
            argv += [f"--{prefix}{side}-file", str(path)]
    argv += ["--source-lang", "en", "--target-lang", "en", "--vocab-size", "16"]
    assert cli.main([*argv, "--model-type", "word", "--output", str(root / "data")]) == 0
    return root / "data"


def test_analyze_from_python_equals_the_verb(tiny, tiny_dataset, tmp_path, capsys):
    from matplotlib.image import imread

    from fadat import outputs
    from fadat.evaluation.analysis import (
        Analysis,
        analyze,
        analyze_model,
        format_table3,
        format_table5,
        load_dat_model,
    )
    from fadat.evaluation.scoring import load_split

    models, names = [tiny["dat"], tiny["dat"]], ["one", "two"]
    capsys.readouterr()
    result = analyze(
        models,
        data=tiny_dataset,
        names=names,
        strategies=["greedy", "lookahead"],
        output_dir=tmp_path / "py",
        options={"beta": 1.5, "seed": None},
    )
    assert capsys.readouterr() == ("", "")  # the library prints nothing
    assert isinstance(result, Analysis)
    assert result.figure == tmp_path / "py" / "vertex_density.png"
    assert result.numbers == tmp_path / "py" / "analysis.json"
    assert json.loads(result.numbers.read_text()) == result.summary
    assert outputs.output_kind(tmp_path / "py") == "analysis"
    written = {p.name for p in (tmp_path / "py").iterdir() if p.name != outputs.MARKER}
    assert written == {"analysis.json", "vertex_density.png"}
    assert [r.name for r in result.reports] == names
    assert all(r.sentences == r.analysed == 6 for r in result.reports)
    # Each strategy got the options it takes (lookahead β; greedy none): the numbers of
    # analyze_model given them directly.
    sources, references = load_split(tiny_dataset, "test", 0)
    model, sp = load_dat_model(tiny["dat"])
    direct = analyze_model(
        model,
        sp,
        "one",
        sources,
        references,
        "en",
        strategies=["greedy", "lookahead"],
        options={"lookahead": {"beta": 1.5}},
    )
    assert result.reports[0].strategies == direct.strategies
    assert result.reports[0].buckets == direct.buckets

    argv = ["analyze", "--model", *map(str, models), "--names", *names, "--data"]
    argv += [str(tiny_dataset), "--strategies", "greedy,lookahead", "--beta", "1.5"]
    printed = _main([*argv, "-o", str(tmp_path / "cli")], capsys)
    # The verb prints the returned reports: the same numbers, to the digit.
    assert printed == (
        f"Table 3: confidence of decoded outputs (nats per sentence; 6 sentences of "
        f"{tiny_dataset} test)\n\n{format_table3(result.reports)}\n"
        "\nTable 5: tokenized BLEU by reference length in 13a tokens (sentences)\n\n"
        f"{format_table5(result.reports)}\n"
        f"\nFigure 1: {tmp_path / 'cli' / 'vertex_density.png'}\n"
        f"numbers: {tmp_path / 'cli' / 'analysis.json'}\n"
    )
    assert (tmp_path / "cli" / "analysis.json").read_bytes() == result.numbers.read_bytes()
    assert np.array_equal(imread(tmp_path / "cli" / "vertex_density.png"), imread(result.figure))
    # One model by its path, labelled by its directory's name, into an earlier analysis.
    again = analyze(
        tiny["dat"], data=tiny_dataset, strategies="greedy", output_dir=result.figure.parent
    )
    assert [r.name for r in again.reports] == ["dat"]
    assert list(again.reports[0].strategies) == ["greedy", "lookahead"]  # + bucket strategy

    # The verb's checks and messages, before any work.
    for bad, message in (
        ({"names": ["one"]}, "--names has 1 labels for 2 models"),
        ({"names": ["one", "one"]}, r"model labels must differ, got \['one', 'one'\]"),
        ({"subset": -1}, "--subset must be >= 0, got -1"),
        ({"max_tokens": -1}, "--max-tokens must be >= 0, got -1"),
        ({"strategies": " , "}, "--strategies is empty"),
        ({"threads": -1}, r"--threads must be in \[0, 1024\], got -1"),
        ({"output_dir": tiny["dat"] / "analysis"}, "--output-dir"),
    ):
        with pytest.raises(InputError, match=message):
            analyze(models, data=tiny_dataset, **{"output_dir": tmp_path / "none", **bad})
    with pytest.raises(InputError, match="give at least one model directory"):
        analyze([], data=tiny_dataset, output_dir=tmp_path / "none")
    with pytest.raises(InputError, match="AT model"):
        analyze(tiny["at"], data=tiny_dataset, output_dir=tmp_path / "none")
    assert not (tmp_path / "none").exists() and not (tiny["dat"] / "analysis").exists()


def test_analyze_threads_above_the_cores_warn(tiny, tiny_dataset, tmp_path, monkeypatch):
    """More threads than cores: refused, or with ``force`` a ThreadsAboveCoresWarning (which
    the command line prints as one ``fadat: warning:`` line) and no print."""
    from fadat.evaluation.analysis import analyze

    monkeypatch.setattr("fadat.options.usable_cores", lambda: 1)
    kwargs = {"data": tiny_dataset, "output_dir": tmp_path / "out", "threads": 2}
    with pytest.raises(InputError, match="--threads 2 is more than the 1 CPU core"):
        analyze(tiny["dat"], **kwargs)
    before = torch.get_num_threads()
    try:
        with (
            pytest.warns(ThreadsAboveCoresWarning, match="--threads 2 is more than the 1 CPU"),
            pytest.raises(InputError, match="--subset must be >= 0"),
        ):
            analyze(tiny["dat"], force=True, subset=-1, **kwargs)
    finally:
        torch.set_num_threads(before)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# serve


def test_serve_checks_its_options_before_loading_the_model(tiny, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from fadat.serve import serve
    from fadat.serve.app import Limits
    from fadat.serve.protocol import ConnectionLimits

    missing = tmp_path / "missing"  # never read: each option is refused first
    for kwargs, message in (
        ({"port": 70000}, r"--port must be in \[0, 65535\], got 70000"),
        ({"max_batch_tokens": -1}, "--max-batch-tokens must be >= 0, got -1"),
        ({"max_tokens": 0}, "--max-tokens must be >= 1, got 0"),
        ({"max_wait_ms": float("nan")}, r"--max-wait-ms must be in \[0, 10000\], got nan"),
        ({"graceful_timeout": float("inf")}, "--graceful-timeout must be a finite number"),
        ({"limits": Limits(max_sentences=0)}, "--max-sentences must be >= 1, got 0"),
        ({"limits": Limits(body_timeout=0.0)}, r"--body-timeout must be in \(0, 3600\]"),
        ({"connections": ConnectionLimits(max_connections=0)}, "--max-connections must be >= 1"),
        ({"connections": ConnectionLimits(max_header_bytes=10)}, "--max-header-bytes must be in"),
        ({"threads": -1}, r"--threads must be in \[0, 1024\], got -1"),
        ({"log_level": "loud"}, "log_level must be one of critical, error"),
    ):
        with pytest.raises(InputError, match=message):
            serve(missing, **kwargs)
    monkeypatch.setattr("fadat.options.usable_cores", lambda: 1)
    with pytest.raises(InputError, match="--threads 2 is more than the 1 CPU core"):
        serve(missing, threads=2)
    with (
        pytest.warns(ThreadsAboveCoresWarning, match="--threads 2 is more than the 1 CPU core"),
        pytest.raises(InputError, match="missing"),  # forced: a warning, then the model
    ):
        serve(missing, threads=2, force=True)


@pytest.mark.slow
def test_serve_from_python_answers_and_stops_on_sigterm(tiny):
    """``fadat.serve.serve`` in a process of its own (it blocks and owns SIGTERM, as
    ``fadat serve`` does): it names its address on stderr, translates as the server of the verb
    does, and exits 0 on SIGTERM."""
    pytest.importorskip("fastapi")
    import httpx

    code = (
        "import sys; from fadat.serve import serve; "
        "serve(sys.argv[1], port=0, max_wait_ms=0.0, log_level='warning')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tiny["dat"])],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        first = proc.stderr.readline()
        assert first.startswith(f"fadat: serving {tiny['dat']} on http://127.0.0.1:"), first
        url = first.split(" on ")[1].strip()
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.post(f"{url}/v1/translate", json={"text": ["ab cd"]})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
        assert answer.status_code == 200, answer.text
        from fadat.translation.translator import Translator

        expected = Translator.from_pretrained(tiny["dat"]).translate(["ab cd"])
        assert [t["text"] for t in answer.json()["translations"]] == expected
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
