"""The inference benchmark's smoke mode (bench/bench_inference.py --smoke) on the tiny random
DAT and AT of tests/test_translate.py: every kind of row runs, CTranslate2's forced rows have
the references' lengths, and the reduced-head rows agree with their full-head rows wherever
the coverage column says they must."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2")

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "bench_inference.py"


def load_bench():
    """bench/bench_inference.py as the module ``bench_inference`` (its dataclass looks its
    module up in sys.modules, and spawned workers import it by that name)."""
    spec = importlib.util.spec_from_file_location("bench_inference", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_inference"] = bench
    spec.loader.exec_module(bench)
    return bench


def models_with_shortlist(tmp_path, pairs, top_k, frequent):
    """The tiny random models (tests/test_translate.py), ``pairs`` (source, reference) written
    to src.txt / ref.txt, and the DAT's shortlist built from them with ``fadat shortlist``.
    Returns (models, src, ref)."""
    from test_translate import random_models

    from fadat import cli

    models = random_models(str(tmp_path / "random"))
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(x + "\n" for x, _ in pairs), encoding="utf-8")
    ref.write_text("".join(y + "\n" for _, y in pairs), encoding="utf-8")
    argv = ["shortlist", "--model", str(models["dat"]), "--source", str(src), "--target", str(ref)]
    assert cli.main([*argv, "--top-k", str(top_k), "--frequent", str(frequent)]) == 0
    return models, src, ref


def test_smoke_mode_runs_every_kind_of_row(tmp_path):
    bench = load_bench()
    pairs = [("ab cd ef", "ab cd"), ("gh ij", "gh ij ef"), ("ab gh", "ab"), ("cd ef gh ij", "cd")]
    models, src, ref = models_with_shortlist(tmp_path, pairs, top_k=1, frequent=0)
    results = bench.main(
        ["--smoke", "--dat", str(models["dat"]), "--at", str(models["at"])]
        + ["--src", str(src), "--ref", str(ref), "--precisions", "fp32", "int8"]
        + ["--upsample-ratios", "3", "--prune-thresholds", "0.001"]
        + ["--json", str(tmp_path / "out.json")]
    )
    names = set(results)
    for name in (
        "DAT lookahead fp32 +sl +prune 0.001",
        "DAT joint-viterbi int8 λ=3 +prune 0.001",
        "CT2 beam5 int8 +vmap",
        "CT2 greedy int8 =ref len",
    ):
        assert name in names, name
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(models["spm"]))
    lengths = [len(sp.encode(line)) for line in ref.read_text(encoding="utf-8").splitlines()]
    for beam in ("greedy", "beam5"):
        outputs = results[f"CT2 {beam} int8 =ref len"]["outputs"]
        assert [len(y) for y in outputs] == lengths
    for name, x in results.items():
        assert x[1]["settings"] and all(v["ms"][0] > 0 for v in x[1]["settings"].values())
        exact = " fp32" in name and ("+prune" in name and "+sl" not in name or "greedy" in name)
        if exact and "cover" in x:  # covered sentences must give the full head's output
            assert x["same_as_full"] >= x["cover"], name
    assert (tmp_path / "out.json").is_file()


def test_dat_replicas_translate_as_the_model_in_process(tmp_path, monkeypatch):
    """``inter 2``: two one-thread worker processes, each batch split in two, give the same
    outputs as the model in this process (fp32, with and without the shortlist and pruning)."""
    from fadat.data.spm import encode_source
    from fadat.models.shortlist import load_shortlist

    bench = load_bench()
    # the workers (spawned, with this process's sys.path) import the module of that name
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    pairs = [("ab cd ef", "ab cd"), ("gh ij", "gh ij ef"), ("ab gh", "ab")]
    pairs += [("cd ef gh ij", "cd"), ("ef", "ef")]
    models, src, _ = models_with_shortlist(tmp_path, pairs, top_k=2, frequent=1)
    path = str(models["dat"] / "shortlist.safetensors")
    model, sp = bench.load_model(models["dat"], "cpu")
    sources = [encode_source(sp, x) for x in src.read_text(encoding="utf-8").splitlines()]
    shortlist = load_shortlist(path, model.config.vocab_size)
    pool = bench.Replicas(str(models["dat"]), 2, ["fp32"], [path])
    try:
        for strategy, sl, file, prune in (
            ("lookahead", None, None, None),
            ("joint-viterbi", shortlist, path, 0.001),
            ("greedy", shortlist, path, None),
        ):
            here = bench.dat_translate(model, strategy, sl, prune)
            there = pool.translate("fp32", strategy, file, prune, None)
            assert there(sources) == here(sources), strategy
            assert there(sources[:1]) == here(sources[:1])
    finally:
        pool.close()
