"""Tests of fadat.evaluation.evaluate: the metrics (multi-reference, tokenized BLEU, length buckets,
paired bootstrap), the latency protocol (interleaving, warm-up), the system/baseline bookkeeping,
and whole runs on random and copy-task models (AT and DAT side by side, report.json, table)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import sacrebleu
import torch
from test_translate import random_sentences
from torch import nn

from fadat import cli
from fadat.cli.evaluate import add_arguments, format_report
from fadat.errors import InputError
from fadat.evaluation.evaluate import (
    System,
    bucket_scores,
    comparison_groups,
    corpus_scores,
    evaluate,
    measure_latency,
    model_labels,
    moses_tokenize,
    paired_bootstrap,
    tokenized_bleu_metric,
)
from fadat.translation.translator import Translator


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    """``fadat evaluate`` sets torch's thread count (``--threads``); undo it afterwards."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def write_data(root: Path, sources: list[str], refs: list[list[str]], split: str = "test") -> Path:
    """A minimal prepared-data layout for evaluation: meta.json + raw/<split>.{src,ref,ref2}."""
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"source_lang": "en", "target_lang": "en"}))
    (raw / f"{split}.src.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    for k, stream in enumerate(refs):
        name = f"{split}.ref.txt" if k == 0 else f"{split}.ref{k + 1}.txt"
        (raw / name).write_text("".join(s + "\n" for s in stream), encoding="utf-8")
    return root


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# Metrics


def test_multiple_references_and_tokenized_bleu():
    ref1 = ["The cat sat on the mat, quietly.", "It rained all day long in the town!"]
    ref2 = ["A cat was sitting on the mat.", "There was rain the whole day in town."]
    hyps = list(ref2)
    both = corpus_scores(hyps, [ref1, ref2], "en")
    assert both["bleu"] == pytest.approx(100.0)
    assert both["tok_bleu"] == pytest.approx(100.0)
    assert both["chrf"] == pytest.approx(100.0)
    assert "nrefs:2" in both["bleu_signature"] and "tok:none" in both["tok_bleu_signature"]
    only_first = corpus_scores(hyps, [ref1], "en")
    assert only_first["bleu"] < 50 and "nrefs:1" in only_first["bleu_signature"]


def test_tokenized_bleu_uses_moses_tokens():
    # Moses splits "mat," into "mat ,"; with tokenize="none" only the tokenised form matches.
    assert moses_tokenize(["on the mat, then"], "en") == ["on the mat , then"]
    hyp, ref = ["he said : yes , then no ."], ["he said: yes, then no."]
    scores = corpus_scores(hyp, [ref], "en")
    assert scores["tok_bleu"] == pytest.approx(100.0)
    raw_none = sacrebleu.corpus_bleu(hyp, [ref], tokenize="none").score
    assert raw_none < 100.0


def test_length_buckets_match_the_paper_edges():
    def sentence(n: int, word: str) -> str:
        return " ".join(f"{word}{i}" for i in range(n))

    lengths = [5, 19, 20, 39, 40, 59, 60, 75]
    refs = [sentence(n, "w") for n in lengths]
    good = {0, 2, 4, 6}  # one sentence of each bucket is translated perfectly, one not at all
    hyps = [refs[i] if i in good else sentence(lengths[i], "x") for i in range(len(refs))]
    tok_hyps = moses_tokenize(hyps, "en")
    tok_refs = [moses_tokenize(refs, "en")]
    buckets = bucket_scores(tok_hyps, tok_refs, refs)
    assert [b["bucket"] for b in buckets] == ["< 20", "20-40", "40-60", ">= 60"]
    assert [b["count"] for b in buckets] == [2, 2, 2, 2]
    for k, b in enumerate(buckets):
        members = [2 * k, 2 * k + 1]
        expected = (
            tokenized_bleu_metric()
            .corpus_score([tok_hyps[i] for i in members], [[tok_refs[0][i] for i in members]])
            .score
        )
        assert b["tok_bleu"] == pytest.approx(expected)
        assert 0 < b["tok_bleu"] < 100


def test_paired_bootstrap_detects_a_better_system():
    refs = [random_sentences(40, seed=1, low=6, high=10)]
    good = list(refs[0])
    bad = [" ".join(s.split()[::-1]) for s in refs[0]]
    result = paired_bootstrap(
        [("bad", bad), ("good", good)], refs, tokenized_bleu_metric(), samples=200
    )
    assert result["bad"]["p_value"] is None
    assert result["good"]["score"] == pytest.approx(100.0)
    assert result["good"]["p_value"] < 0.05
    # One word changed in one of 40 sentences: not a significant difference.
    almost = [good[0].rsplit(" ", 1)[0] + " zz", *good[1:]]
    close = paired_bootstrap(
        [("good", good), ("almost", almost)], refs, tokenized_bleu_metric(), samples=200
    )
    assert close["almost"]["score"] < 100.0
    assert close["almost"]["p_value"] > 0.05


# ----------------------------------------------------------------------------------------------
# Latency protocol and bookkeeping


class _FakeConfig:
    def __init__(self, model_type: str) -> None:
        self.model_type = model_type


class _FakeModel(nn.Module):
    def __init__(self, model_type: str = "dat") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.config = _FakeConfig(model_type)


class _RecordingSystem(System):
    calls: list[tuple[str, str]] = []

    def translate(self, sentences, max_sentences, max_tokens):
        assert max_sentences == 1 and len(sentences) == 1
        self.calls.append((self.name, sentences[0]))
        return list(sentences)


def test_latency_interleaves_systems_after_warmup():
    _RecordingSystem.calls = []
    systems = [_RecordingSystem(n, n, _FakeModel(), None, "greedy") for n in ("a", "b", "c")]
    sentences = ["s0", "s1", "s2", "s3"]
    times = measure_latency(systems, sentences, warmup=5)
    calls = _RecordingSystem.calls
    assert len(calls) == 3 * (5 + 4)
    warm, timed = calls[:15], calls[15:]
    assert [s for _, s in warm] == [s for s in ["s0", "s1", "s2", "s3", "s0"] for _ in range(3)]
    # Sentence by sentence, every system once, the order rotating by one each sentence.
    assert [n for n, _ in timed] == list("abcbcacababc")
    assert [s for _, s in timed] == [s for s in sentences for _ in range(3)]
    assert {n: len(v) for n, v in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for v in times.values() for t in v)


def test_comparison_groups_and_labels():
    def system(label, strategy, kind="dat"):
        return System(f"{label}:{strategy}", label, _FakeModel(kind), None, strategy)

    systems = [
        system("at", "greedy", "at"),
        system("at", "beam5", "at"),
        system("nll", "greedy"),
        system("nll", "lookahead"),
        system("fa", "greedy"),
        system("fa", "lookahead"),
    ]
    groups = comparison_groups(systems, "at:beam5")
    assert groups[0][0] == "at:beam5" and sorted(groups[0][1:]) == sorted(
        s.name for s in systems if s.name != "at:beam5"
    )
    assert groups[1:] == [["nll:greedy", "fa:greedy"], ["nll:lookahead", "fa:lookahead"]]
    assert model_labels(["runs/a/model", "runs/b/model", "x/dat", "y/dat"]) == [
        "a/model",
        "b/model",
        "dat",
        "dat#2",
    ]


# ----------------------------------------------------------------------------------------------
# Whole runs


# Line 7 is over-long (truncated, as evaluate does); the re-translation below warns about it.
@pytest.mark.filterwarnings("ignore:line 7. 10 source tokens:UserWarning")
def test_evaluate_random_models_side_by_side(models, tmp_path, capsys):
    sources = random_sentences(12, seed=20, low=1, high=9)
    refs = [random_sentences(12, seed=21), random_sentences(12, seed=22)]
    data = write_data(tmp_path / "data", sources, refs)
    write_data(data, sources, refs, split="valid")
    report_path = tmp_path / "out" / "report.json"
    argv = [
        "evaluate",
        "--model",
        str(models["at"]),
        str(models["dat"]),
        "--data",
        str(data),
        "--strategies",
        "greedy,lookahead,joint-viterbi",
        "--warmup",
        "2",
        "--latency-subset",
        "3",
        "--threads",
        "1",
        "--bootstrap",
        "50",
        "--batch-size",
        "5",
        "--tune-length-penalty",
        "--length-penalty-grid",
        "0.5,1.5",
        "--report",
        str(report_path),
        "--save-hypotheses",
        str(tmp_path / "hyps"),
    ]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(report_path.read_text(encoding="utf-8"))
    names = [s["name"] for s in report["systems"]]
    assert names == ["at:greedy", "at:beam5", "dat:greedy", "dat:lookahead", "dat:joint-viterbi"]
    assert report["baseline"] == "at:beam5"
    assert report["data"]["references"] == 2 and report["data"]["sentences"] == 12
    env = report["environment"]
    assert env["torch"] == torch.__version__ and env["torch_threads"] == 1
    assert report["settings"]["warmup"] == 2 and report["settings"]["threads"] == 1
    # Model directories run on torch (--engine auto, the default), in fp32 (no --precision).
    assert (report["settings"]["engine"], report["settings"]["precision"]) == ("auto", None)
    assert {(m["engine"], m["precision"]) for m in report["models"]} == {("torch", "fp32")}
    assert {(s["engine"], s["precision"]) for s in report["systems"]} == {("torch", "fp32")}
    assert "onnxruntime" not in env and "onnxruntime" not in printed
    assert all(row.split()[1:3] == ["torch", "fp32"] for row in printed.splitlines()[2:7])
    base = report["systems"][1]
    dat = Translator.from_pretrained(models["dat"])
    at = Translator.from_pretrained(models["at"])
    for s in report["systems"]:
        for name in names:
            assert name in printed
        hyps = (
            (tmp_path / "hyps" / (s["name"].replace(":", ".") + ".txt"))
            .read_text(encoding="utf-8")
            .split("\n")[:-1]
        )
        # The scored hypotheses are the translation core's output with the same settings.
        translator = at if s["model_type"] == "at" else dat
        assert hyps == translator.translate(sources, s["strategy"], **s["options"])
        assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, refs).score)
        assert s["speedup_latency"] == pytest.approx(
            base["latency_ms_median"] / s["latency_ms_median"]
        )
        assert s["speedup_throughput"] == pytest.approx(s["throughput"] / base["throughput"])
        assert s["latency_sentences"] == 3
        assert sum(b["count"] for b in s["length_buckets"]) == 12
        if s["name"] != "at:beam5":
            assert 0 < s["p_value_bleu"]["at:beam5"] <= 1
    tuning = report["tuning"]["dat:joint-viterbi"]
    assert [g["length_penalty"] for g in tuning["grid"]] == [0.5, 1.5]
    top = max(g["tok_bleu"] for g in tuning["grid"])
    best = min(
        (g for g in tuning["grid"] if g["tok_bleu"] == top),
        key=lambda g: abs(g["length_penalty"] - 1),
    )
    assert tuning["best"] == best["length_penalty"]
    assert report["systems"][4]["options"]["length_penalty"] == tuning["best"]
    for g in tuning["grid"]:
        hyps = dat.translate(sources, "joint-viterbi", length_penalty=g["length_penalty"])
        expected = (
            tokenized_bleu_metric()
            .corpus_score(moses_tokenize(hyps, "en"), [moses_tokenize(r, "en") for r in refs])
            .score
        )
        assert g["tok_bleu"] == pytest.approx(expected)
    assert "×" in printed and "tokBLEU" in printed


def test_evaluate_input_problems(models, tmp_path, capsys):
    data = write_data(tmp_path / "data", ["ab cd"], [["ab cd"]])
    cases = [
        (["--data", str(tmp_path / "nodata")], "meta.json"),
        (["--data", str(data), "--split", "valid"], "valid"),
        (["--data", str(data), "--strategies", "greedy,nope"], "nope"),
        (["--data", str(data), "--baseline", "zzz"], "zzz"),
        (["--data", str(data), "--tune-length-penalty", "--length-penalty-grid", "1,x"], "grid"),
        (["--data", str(data), "--shortlist"], "no shortlist"),  # the DAT directory has none
        (["--data", str(data), "--prune-threshold", "1.5"], "[0, 1]"),
    ]
    for extra, needle in cases:
        code = cli.main(
            [
                "evaluate",
                "--model",
                str(models["dat"]),
                *extra,
                "--no-latency",
                "--report",
                str(tmp_path / "r.json"),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and needle in err and "Traceback" not in err, err
    # the DAT-only options with no DAT among the models: refused, not ignored
    for extra, needle in (
        (["--shortlist"], "--shortlist: for DAT models"),
        (["--prune-threshold", "0.1"], "--prune-threshold: for DAT models"),
        (["--shortlist", "x.safetensors", "--prune-threshold", "0.1"], "--shortlist and --prune"),
    ):
        argv = ["evaluate", "--model", str(models["at"]), "--data", str(data), *extra]
        code = cli.main([*argv, "--no-latency", "--report", str(tmp_path / "r.json")])
        err = capsys.readouterr().err
        assert code == 2 and needle in err and "none of the models takes it (at)" in err, err
        assert err.count("\n") == 1 and not (tmp_path / "r.json").exists()


def _without_timings(report: dict) -> dict:
    """The report as JSON reads it back, without what differs between two runs: the
    environment, the settings and the timed numbers."""
    report = json.loads(json.dumps(report, ensure_ascii=False))
    timed = ("throughput", "throughput_seconds", "speedup_throughput")
    for system in report["systems"]:
        for key in timed:
            system.pop(key)
    return {k: v for k, v in report.items() if k not in ("environment", "settings")}


def test_evaluate_from_python_gives_the_cli_report(models, tmp_path, capsys):
    """:func:`fadat.evaluation.evaluate.evaluate` with keyword arguments, no argparse: the report
    and the hypotheses of ``fadat evaluate`` with the same settings (decoding options to the
    DAT strategies that take them, --max-len-* to the AT, the tuned β_v, the bootstrap)."""
    sources = random_sentences(8, seed=30, low=1, high=7)
    refs = [random_sentences(8, seed=31), random_sentences(8, seed=32)]
    data = write_data(tmp_path / "data", sources, refs)
    write_data(data, sources, refs, split="valid")
    report_path = tmp_path / "report.json"
    argv = [
        "evaluate", "--model", str(models["at"]), str(models["dat"]), "--data", str(data),
        "--strategies", "lookahead,joint-viterbi", "--beta", "0.5", "--max-len-a", "0",
        "--max-len-b", "4", "--tune-length-penalty", "--length-penalty-grid", "0.5,1.5",
        "--no-latency", "--bootstrap", "20", "--batch-size", "3", "--threads", "1",
        "--report", str(report_path), "--save-hypotheses", str(tmp_path / "cli-hyps"),
    ]  # fmt: skip
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    from_cli = json.loads(report_path.read_text(encoding="utf-8"))
    report = evaluate(
        [models["at"], models["dat"]],
        data=data,
        strategies=["lookahead", "joint-viterbi"],
        options={"beta": 0.5, "max_len_a": 0.0, "max_len_b": 4},
        tune_length_penalty=True,
        length_penalty_grid=[0.5, 1.5],
        latency=False,
        bootstrap=20,
        batch_size=3,
        threads=1,
        save_hypotheses=tmp_path / "py-hyps",
    )
    assert _without_timings(report) == _without_timings(from_cli)
    names = [s["name"] for s in report["systems"]]
    assert names == ["at:greedy", "at:beam5", "dat:lookahead", "dat:joint-viterbi"]
    assert report["systems"][2]["options"] == {"beta": 0.5}
    assert report["systems"][1]["options"] == {
        "length_penalty": 1.0, "beam_size": 5, "max_len_a": 0.0, "max_len_b": 4
    }  # fmt: skip
    for name in names:
        file = name.replace(":", ".") + ".txt"
        hyps = (tmp_path / "py-hyps" / file).read_text(encoding="utf-8")
        assert hyps == (tmp_path / "cli-hyps" / file).read_text(encoding="utf-8")
        assert all(len(line.split()) <= 4 for line in hyps.splitlines()[:8] if name[:3] == "at:")
    # The table is the report's: printed from the Python report, only the timed cells differ.
    table = format_report(report).splitlines()
    assert [row.split()[:4] for row in table[2:6]] == [
        row.split()[:4] for row in printed.splitlines()[2:6]
    ]
    # settings: the Python call's keywords; the command line records its flags.
    assert report["settings"]["strategies"] == ["lookahead", "joint-viterbi"]
    assert report["settings"]["options"] == {"beta": 0.5, "max_len_a": 0.0, "max_len_b": 4}
    assert report["settings"]["models"] == [str(models["at"]), str(models["dat"])]
    assert from_cli["settings"]["strategies"] == "lookahead,joint-viterbi"
    assert from_cli["settings"]["report"] == str(report_path)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"options": {"bogus": 1}}, "unknown decoding option 'bogus'"),
        ({"options": {"beta": float("nan")}}, "option beta"),
        ({"batch_size": 0}, "--batch-size must be >= 1"),
        ({"warmup": -1}, "--warmup must be >= 0"),
        ({"latency_subset": 1.5}, "--latency-subset must be >= 0"),
        ({"length_penalty_grid": []}, "--length-penalty-grid"),
        ({"length_penalty_grid": [1.0, float("inf")]}, "--length-penalty-grid"),
        ({"strategies": " , "}, "--strategies is empty"),
        ({"strategies": ["nope"]}, "'nope'"),
        ({"baseline": "zzz"}, "--baseline 'zzz'"),
        ({"threads": -1}, "--threads must be in"),
        ({"threads": "2"}, "--threads must be an integer"),
        ({"strategies": [1]}, "--strategies must be strategy names"),
        ({"engine": "tensorrt"}, "--engine must be one of auto, torch, onnxruntime"),
        ({"precision": "fp16"}, "--precision must be one of fp32, bf16, int8"),
    ],
)
def test_evaluate_from_python_refuses_bad_settings(models, tmp_path, keywords, message):
    data = write_data(tmp_path / "data", ["ab cd"], [["ab cd"]])
    with pytest.raises(InputError, match=re.escape(message)):
        evaluate(models["dat"], data=data, latency=False, bootstrap=0, **keywords)


def test_evaluate_precision_on_torch(models, tmp_path):
    """``precision="int8"`` on the torch engine: the DAT's systems decode the int8 copy (the
    hypotheses of the int8 translator) and are recorded as such; an AT model, which runs fp32
    only, is refused naming its directory."""
    sources = random_sentences(6, seed=40, low=1, high=6)
    data = write_data(tmp_path / "data", sources, [random_sentences(6, seed=41)])
    report = evaluate(
        models["dat"], data=data, strategies=["lookahead"], precision="int8", latency=False,
        bootstrap=0, threads=1, save_hypotheses=tmp_path / "hyps",
    )  # fmt: skip
    (system,) = report["systems"]
    assert (system["engine"], system["precision"]) == ("torch", "int8")
    assert report["models"][0]["precision"] == "int8"
    hyps = (tmp_path / "hyps" / "dat.lookahead.txt").read_text(encoding="utf-8").splitlines()
    int8 = Translator.from_pretrained(models["dat"], precision="int8")
    assert hyps == int8.translate(sources, "lookahead")
    with pytest.raises(InputError, match=re.escape(f"{models['at']} holds an AT model")):
        evaluate([models["dat"], models["at"]], data=data, precision="int8", latency=False)


def test_evaluate_from_python_warns_of_threads_above_the_cores(models, tmp_path, monkeypatch):
    """More threads than cores are used with a ThreadsAboveCoresWarning (which the command line
    prints as one ``fadat: warning:`` line), not a print of its own."""
    from fadat.errors import ThreadsAboveCoresWarning

    data = write_data(tmp_path / "data", ["ab cd"], [["ab cd"]])
    monkeypatch.setattr("fadat.options.usable_cores", lambda: 1)
    before = torch.get_num_threads()
    try:
        with pytest.warns(ThreadsAboveCoresWarning, match="--threads 2 is more than the 1 CPU"):
            evaluate(models["dat"], data=data, latency=False, bootstrap=0, threads=2)
    finally:
        torch.set_num_threads(before)


def test_evaluate_from_python_checks_save_hypotheses_before_any_work(models, tmp_path):
    data = write_data(tmp_path / "data", ["ab cd"], [["ab cd"]])
    with pytest.raises(InputError, match="--save-hypotheses .* lies inside the --model"):
        evaluate(models["dat"], data=data, save_hypotheses=models["dat"] / "hyps")
    with pytest.raises(InputError, match="at least one model"):
        evaluate([], data=data)


@pytest.mark.slow
def test_evaluate_copy_model_scores_100(copy_model, models, tmp_path, capsys):
    copy = copy_model
    report_path = tmp_path / "report.json"
    argv = [
        "evaluate",
        "--model",
        str(models["at"]),
        str(copy["model"]),
        "--data",
        str(copy["data"]),
        "--subset",
        "12",
        "--latency-subset",
        "4",
        "--warmup",
        "2",
        "--bootstrap",
        "100",
        "--threads",
        "1",
        "--report",
        str(report_path),
    ]
    assert cli.main(argv) == 0
    report = json.loads(report_path.read_text(encoding="utf-8"))
    dat_systems = [s for s in report["systems"] if s["model_type"] == "dat"]
    assert [s["strategy"] for s in dat_systems] == ["greedy", "lookahead", "joint-viterbi"]
    for s in dat_systems:
        assert s["bleu"] == pytest.approx(100.0)
        assert s["tok_bleu"] == pytest.approx(100.0)
        assert s["chrf"] == pytest.approx(100.0)
        assert s["p_value_bleu"][report["baseline"]] < 0.05
    assert "speed-up" in capsys.readouterr().out
    # Against a DAT baseline: the other DAT strategies produce the same (perfect) outputs and
    # are marked "same" instead of sacreBLEU's p = 1/(samples+1) for identical systems.
    baseline = dat_systems[0]["name"]
    assert cli.main([*argv, "--baseline", baseline, "--no-latency"]) == 0
    report = json.loads(report_path.read_text(encoding="utf-8"))
    by_name = {s["name"]: s for s in report["systems"]}
    assert by_name[dat_systems[1]["name"]]["identical_to"] == [baseline]
    assert by_name[dat_systems[2]["name"]]["identical_to"] == [baseline]
    assert "identical_to" not in by_name[f"{report['models'][0]['label']}:greedy"]
    assert "latency_ms_median" not in by_name[baseline]
    table = capsys.readouterr().out
    assert table.count(" same") == 2
