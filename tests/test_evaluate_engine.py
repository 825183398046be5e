"""``fadat evaluate --engine``: the test run's tiny random DAT exported for ONNX Runtime
(conftest.dat_onnx) and evaluated on the engine gives the hypotheses of ``fadat translate
--engine onnxruntime`` with the same strategy and options and, in fp32, those of the torch
evaluation of the model it was exported from; a spy on :class:`fadat.engine.runtime.OnnxDAT`
shows that the engine decoded them (and in which precision); the report and the printed table
name each system's engine and precision; a mixed list runs each directory on its own engine;
what the engine does not run is refused with a message naming the model. The torch side of
``--engine``/``--precision``: tests/test_evaluate.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from test_evaluate import write_data  # noqa: E402
from test_translate import (  # noqa: E402
    _assert_one_error_line,
    _one_thread,  # noqa: F401  (autouse: the tiny models on one thread)
    random_sentences,
    run_cli,
)

from fadat.engine.runtime import OnnxDAT  # noqa: E402

#: The options of every run below: no latency unless asked, a short bootstrap, one thread.
QUICK = ["--no-latency", "--bootstrap", "20", "--threads", "1", "--batch-size", "4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Ten random sentences (at most 6 words: the tiny models read 8 source positions) as the
    test and valid splits, two reference streams."""
    sources = random_sentences(10, seed=60, low=1, high=6)
    refs = [random_sentences(10, seed=61), random_sentences(10, seed=62)]
    root = write_data(tmp_path_factory.mktemp("engine-data"), sources, refs)
    return write_data(root, sources, refs, split="valid")


@pytest.fixture
def spy(monkeypatch) -> list[tuple[str, str]]:
    """``(precision, method)`` of every graph run of an :class:`OnnxDAT` (``run``: the top-1
    decoders; ``run_top_k``: the beam search)."""
    calls: list[tuple[str, str]] = []
    for name in ("run", "run_top_k"):
        real = getattr(OnnxDAT, name)

        def wrapped(self, source, upsample_ratio=None, _real=real, _name=name):
            calls.append((self.precision, _name))
            return _real(self, source, upsample_ratio)

        monkeypatch.setattr(OnnxDAT, name, wrapped)
    return calls


def run_evaluate(argv, tmp_path, capsys, monkeypatch, name="run"):
    """``fadat evaluate`` in-process with ``--save-hypotheses``; returns ``(report, printed
    table, {system name: hypotheses}, stderr)``."""
    report_path, hyps_dir = tmp_path / f"{name}.json", tmp_path / f"{name}-hyps"
    argv = [*argv, "--report", str(report_path), "--save-hypotheses", str(hyps_dir)]
    code, out, err = run_cli(["evaluate", *argv], capsys, monkeypatch)
    assert code == 0, err
    report = json.loads(report_path.read_text(encoding="utf-8"))
    hyps = {
        s["name"]: (hyps_dir / (s["name"].replace(":", ".") + ".txt"))
        .read_text(encoding="utf-8")
        .splitlines()
        for s in report["systems"]
    }
    return report, out, hyps, err


def run_translate(model, flags, source, capsys, monkeypatch) -> list[str]:
    code, out, err = run_cli(
        ["translate", "--engine", "onnxruntime", "--model", str(model), "--input", str(source)]
        + flags,
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    return out.splitlines()


#: Strategies and options of the engine run below: every strategy the engine offers; the beam
#: options go to the beam search only (--top-cand-n is read by lookahead only with n-gram bans,
#: so the engine's lookahead, which has none, leaves it out as the torch one ignores it).
STRATEGIES = "greedy,lookahead,viterbi,joint-viterbi,beam"
BEAM_FLAGS = ["--beam-size", "20", "--top-cand-n", "4"]


def test_engine_evaluation_is_the_engines_translation_and_torchs(
    dat_onnx, data, spy, tmp_path, capsys, monkeypatch
):
    """fp32: every strategy's hypotheses equal ``fadat translate --engine onnxruntime``'s and
    the torch evaluation's of the source model; the engine decoded them (the spy) and the
    torch evaluation did not use it; the report and the table say which engine ran."""
    export = dat_onnx["dir"] / "fp32"
    flags = ["--data", str(data), "--strategies", STRATEGIES, *BEAM_FLAGS, *QUICK]
    flags += ["--latency-subset", "2", "--warmup", "1", "--latency"]  # the batch-1 timing too
    report, printed, hyps, _ = run_evaluate(
        ["--engine", "onnxruntime", "--model", str(export), *flags], tmp_path, capsys, monkeypatch
    )
    strategies = STRATEGIES.split(",")
    assert [s["name"] for s in report["systems"]] == [f"fp32:{s}" for s in strategies]
    assert ("fp32", "run") in spy and ("fp32", "run_top_k") in spy
    assert {p for p, _ in spy} == {"fp32"}
    source = data / "raw" / "test.src.txt"
    for strategy in strategies:
        extra = BEAM_FLAGS if strategy == "beam" else []
        translated = run_translate(
            export, ["--strategy", strategy, *extra], source, capsys, monkeypatch
        )
        assert hyps[f"fp32:{strategy}"] == translated, strategy
    # What the report and the table record.
    for system in report["systems"]:
        assert (system["engine"], system["precision"]) == ("onnxruntime", "fp32")
        assert system["latency_sentences"] == 2 and system["latency_ms_median"] > 0
    assert report["systems"][-1]["options"] == {"beam_size": 20, "top_cand_n": 4}
    assert report["systems"][1]["options"] == {}  # lookahead: no --top-cand-n
    (model,) = report["models"]
    assert (model["engine"], model["precision"], model["model_type"]) == (
        "onnxruntime",
        "fp32",
        "dat",
    )
    source_config = json.loads((dat_onnx["dat"] / "config.json").read_text(encoding="utf-8"))
    assert model["config"] == source_config["config"]
    assert model["dir"] == str(export)
    assert report["settings"]["engine"] == "onnxruntime"
    import onnxruntime

    env = report["environment"]
    assert env["onnxruntime"] == onnxruntime.__version__ and env["onnxruntime_intra_threads"] == 1
    rows = printed.splitlines()[2 : 2 + len(strategies)]
    assert all(row.split()[1:3] == ["onnxruntime", "fp32"] for row in rows), printed
    assert f"onnxruntime {onnxruntime.__version__}, 1 intra-op threads" in printed
    # The torch evaluation of the model the export was made from: the same hypotheses, and no
    # graph run of the engine.
    spy.clear()
    torch_report, torch_printed, torch_hyps, _ = run_evaluate(
        ["--engine", "torch", "--model", str(dat_onnx["dat"]), *flags],
        tmp_path,
        capsys,
        monkeypatch,
        name="torch",
    )
    assert spy == []
    assert {k.split(":")[1]: v for k, v in torch_hyps.items()} == {
        k.split(":")[1]: v for k, v in hyps.items()
    }
    assert {(s["engine"], s["precision"]) for s in torch_report["systems"]} == {("torch", "fp32")}
    assert "onnxruntime" not in torch_report["environment"]
    assert "onnxruntime" not in torch_printed
    # The scores are computed from the hypotheses alone: equal hypotheses, equal scores.
    for a, b in zip(report["systems"], torch_report["systems"], strict=True):
        assert (a["bleu"], a["chrf"], a["tok_bleu"]) == (b["bleu"], b["chrf"], b["tok_bleu"])


def test_int8_export_and_tuning_on_the_engine(dat_onnx, data, spy, tmp_path, capsys, monkeypatch):
    """The int8 export is the one decoded (the spy sees int8 sessions only) and recorded; its
    hypotheses are ``fadat translate``'s of the int8 export; ``--tune-length-penalty`` tunes the
    engine's joint-Viterbi as the torch engine's; ``--precision`` checks the export's. The int8
    graph quantizes its activations with one scale per batch (dynamic quantization), so its
    outputs depend on the batch a sentence is in: both sides translate one sentence at a time
    (``--batch-size 1``, ``--max-tokens 1``)."""
    export = dat_onnx["dir"] / "int8"
    flags = ["--data", str(data), "--strategies", "lookahead,joint-viterbi", *QUICK]
    flags += ["--batch-size", "1"]
    flags += ["--tune-length-penalty", "--length-penalty-grid", "0.5,1.5"]
    report, printed, hyps, _ = run_evaluate(
        ["--engine", "onnxruntime", "--precision", "int8", "--model", str(export), *flags],
        tmp_path,
        capsys,
        monkeypatch,
    )
    assert spy and {p for p, _ in spy} == {"int8"}
    assert {(s["engine"], s["precision"]) for s in report["systems"]} == {("onnxruntime", "int8")}
    assert report["settings"]["precision"] == "int8"
    assert "onnxruntime int8" in printed
    tuned = report["tuning"]["int8:joint-viterbi"]
    assert [g["length_penalty"] for g in tuned["grid"]] == [0.5, 1.5]
    best = report["systems"][1]["options"]["length_penalty"]
    assert best == tuned["best"]
    source = data / "raw" / "test.src.txt"
    assert hyps["int8:lookahead"] == run_translate(
        export, ["--strategy", "lookahead", "--max-tokens", "1"], source, capsys, monkeypatch
    )
    joint = ["--strategy", "joint-viterbi", "--length-penalty", str(best), "--max-tokens", "1"]
    assert hyps["int8:joint-viterbi"] == run_translate(export, joint, source, capsys, monkeypatch)


@pytest.fixture(scope="module")
def arpa(models, tmp_path_factory) -> Path:
    """The tiny LM of tests/test_lm_cli.py over the tiny models' pieces."""
    from test_lm_cli import FAVOURITE, pieces, write_arpa

    words = [w for w in pieces(models["spm"]) if not w.startswith("<")]
    return write_arpa(tmp_path_factory.mktemp("lm") / "pieces.arpa", words, FAVOURITE)


def test_beam_with_a_language_model_on_the_engine(
    dat_onnx, data, arpa, spy, tmp_path, capsys, monkeypatch
):
    """``--strategies beam --lm FILE --gamma γ`` on the engine: ``fadat translate``'s beam with
    the LM, and the torch evaluation's (fp32); the LM changed the outputs."""
    pytest.importorskip("kenlm")
    pytest.importorskip("numba")
    export = dat_onnx["dir"] / "fp32"
    lm = ["--lm", str(arpa), "--gamma", "2", "--beam-size", "10"]
    flags = ["--data", str(data), "--strategies", "beam", *lm, *QUICK]
    report, _, hyps, _ = run_evaluate(
        ["--model", str(export), *flags], tmp_path, capsys, monkeypatch
    )
    assert ("fp32", "run_top_k") in spy
    (system,) = report["systems"]
    assert system["engine"] == "onnxruntime" and system["options"]["lm"] == str(arpa)
    source = data / "raw" / "test.src.txt"
    with_lm = run_translate(export, ["--strategy", "beam", *lm], source, capsys, monkeypatch)
    assert hyps["fp32:beam"] == with_lm
    plain = ["--strategy", "beam", "--beam-size", "10"]
    assert run_translate(export, plain, source, capsys, monkeypatch) != with_lm
    _, _, torch_hyps, _ = run_evaluate(
        ["--model", str(dat_onnx["dat"]), *flags], tmp_path, capsys, monkeypatch, name="torch"
    )
    assert torch_hyps["dat:beam"] == with_lm


def test_auto_runs_each_directory_on_its_own_engine(
    models, dat_onnx, data, spy, tmp_path, capsys, monkeypatch
):
    """``--engine auto`` (the default) with a DAT and an AT model directory and the fp32 and
    int8 exports of that DAT: the directories on torch, the exports on ONNX Runtime, side by
    side in one table; the fp32 export's outputs are the torch DAT's (marked ``same``)."""
    exports = [dat_onnx["dir"] / p for p in ("fp32", "int8")]
    dirs = [dat_onnx["dat"], models["at"], *exports]
    flags = [
        "--data",
        str(data),
        "--strategies",
        "lookahead",
        *QUICK,
        "--baseline",
        "dat:lookahead",
    ]
    report, printed, hyps, _ = run_evaluate(
        ["--model", *map(str, dirs), *flags], tmp_path, capsys, monkeypatch
    )
    ran = {s["name"]: (s["engine"], s["precision"]) for s in report["systems"]}
    assert ran == {
        "dat:lookahead": ("torch", "fp32"),
        "at:greedy": ("torch", "fp32"),
        "at:beam5": ("torch", "fp32"),
        "fp32:lookahead": ("onnxruntime", "fp32"),
        "int8:lookahead": ("onnxruntime", "int8"),
    }
    assert [m["engine"] for m in report["models"]] == [
        "torch",
        "torch",
        "onnxruntime",
        "onnxruntime",
    ]
    assert {p for p, _ in spy} == {"fp32", "int8"}
    assert hyps["fp32:lookahead"] == hyps["dat:lookahead"]
    by_name = {s["name"]: s for s in report["systems"]}
    assert by_name["fp32:lookahead"]["identical_to"] == ["dat:lookahead"]
    for name, (engine, precision) in ran.items():
        row = next(r for r in printed.splitlines() if r.startswith(name + " "))
        assert row.split()[1:3] == [engine, precision]
    # --precision int8 on a mixed list: the torch DAT converts, the AT cannot (named).
    code, _, err = run_cli(
        ["evaluate", "--model", *map(str, dirs), "--precision", "int8", *flags], capsys, monkeypatch
    )
    _assert_one_error_line(code, err, "--precision int8", str(models["at"]), "AT model", "fp32")


def test_a_dat_model_directory_is_exported_for_the_run(
    dat_onnx, data, spy, tmp_path, capsys, monkeypatch
):
    """``--engine onnxruntime --model DAT_DIR``: exported to a temporary directory in the
    precision asked (as ``fadat translate`` does; the export is faked here by a copy of the
    test run's export, which is what it would write) and evaluated there."""
    import shutil

    import fadat.translation.onnx_export as onnx_export

    exported = []

    def fake_export(model_dir, output, precision="fp32", **_):
        exported.append((Path(model_dir), precision))
        shutil.copytree(dat_onnx["dir"] / precision, output)
        return Path(output)

    monkeypatch.setattr(onnx_export, "export_onnx", fake_export)
    flags = ["--data", str(data), "--strategies", "greedy,lookahead", *QUICK]
    argv = ["--engine", "onnxruntime", "--precision", "int8", "--model", str(dat_onnx["dat"])]
    report, _, hyps, err = run_evaluate([*argv, *flags], tmp_path, capsys, monkeypatch)
    assert exported == [(dat_onnx["dat"], "int8")]
    assert f"exporting {dat_onnx['dat']} to ONNX (int8) for this run" in err
    assert {p for p, _ in spy} == {"int8"}
    (model,) = report["models"]
    assert (model["dir"], model["engine"], model["precision"]) == (
        str(dat_onnx["dat"]),
        "onnxruntime",
        "int8",
    )
    _, _, from_export, _ = run_evaluate(
        ["--model", str(dat_onnx["dir"] / "int8"), *flags], tmp_path, capsys, monkeypatch, "x"
    )
    assert list(hyps.values()) == list(from_export.values())


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--engine", "onnxruntime", "--model", "{at}"], ["{at}", "AT model", "DAT models only"]),
        (["--engine", "torch", "--model", "{fp32}"], ["{fp32}", "--engine onnxruntime"]),
        (
            ["--model", "{fp32}", "--strategies", "lookahead,sample"],
            ["fp32:", "'sample'", "onnxruntime engine"],
        ),
        (
            ["--model", "{fp32}", "--strategies", "lookahead", "--no-repeated-ngram", "2"],
            ["fp32:", "'lookahead'", "onnxruntime engine", "--no-repeated-ngram"],
        ),
        (["--model", "{fp32}", "--shortlist"], ["--shortlist", "{fp32}", "onnxruntime engine"]),
        (
            ["--model", "{fp32}", "--prune-threshold", "0.1"],
            ["--prune-threshold", "{fp32}", "onnxruntime engine"],
        ),
        (["--model", "{fp32}", "--precision", "int8"], ["{fp32}", "in fp32, not int8"]),
        (["--model", "{fp32}", "--precision", "bf16"], ["{fp32}", "in fp32, not bf16"]),
        (["--model", "{fp32}", "--device", "cuda"], ["--device cuda", "{fp32}", "CPU only"]),
    ],
)
def test_what_the_engine_does_not_run_is_refused(
    models, dat_onnx, data, spy, extra, needles, tmp_path, capsys, monkeypatch
):
    """One error line naming the model (and the flag, the strategy or the engine), before any
    sentence is decoded; ``--device cuda`` is checked as if CUDA were there."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    names = {"at": models["at"], "fp32": dat_onnx["dir"] / "fp32"}
    argv = ["evaluate", "--data", str(data), *QUICK, "--report", str(tmp_path / "r.json")]
    argv += [a.format(**names) for a in extra]
    code, _, err = run_cli(argv, capsys, monkeypatch)
    _assert_one_error_line(code, err, *(n.format(**names) for n in needles))
    assert spy == [] and not (tmp_path / "r.json").exists()


def test_beam_on_a_version_1_export_is_refused(dat_onnx, data, tmp_path, capsys, monkeypatch):
    """An export of format version 1 (no top tokens) still evaluates the top-1 strategies and
    refuses ``beam`` with the engine's reason, naming the model."""
    from test_engine_beam import version_1_copy

    old = version_1_copy(dat_onnx["dir"] / "fp32", tmp_path / "v1")
    base = ["evaluate", "--model", str(old), "--data", str(data), *QUICK]
    base += ["--report", str(tmp_path / "r.json")]
    code, _, err = run_cli([*base, "--strategies", "lookahead,beam"], capsys, monkeypatch)
    _assert_one_error_line(code, err, "v1:", "format-version-1", "export the model again")
    code, _, err = run_cli([*base, "--strategies", "lookahead"], capsys, monkeypatch)
    assert code == 0, err
