"""The inference benchmark's smoke mode (bench/bench_inference.py --smoke) on the tiny random
DAT and AT of tests/test_translate.py: every kind of row runs, CTranslate2's forced rows have
the references' lengths, the reduced-head rows agree with their full-head rows wherever
the coverage column says they must, the ONNX Runtime rows give the torch rows' outputs (fp32)
with their memory and size on disk, the profiles add up; and :func:`fadat.process.cpu_features`
on fake ``/proc/cpuinfo`` files."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "bench_inference.py"
needs_ct2 = pytest.mark.skipif(
    importlib.util.find_spec("ctranslate2") is None, reason="ctranslate2 is not installed"
)
needs_kenlm = pytest.mark.skipif(
    importlib.util.find_spec("kenlm") is None,
    reason="kenlm is not installed (pip install 'fadat[lm]'): the beam+LM rows are not exercised",
)
needs_ort = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None
    or importlib.util.find_spec("onnxscript") is None,
    reason="onnxruntime/onnxscript not installed (pip install 'fadat[onnx]'): the ONNX Runtime "
    "rows are not exercised",
)


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


@needs_ct2
def test_smoke_mode_runs_every_kind_of_row(tmp_path):
    bench = load_bench()
    pairs = [("ab cd ef", "ab cd"), ("gh ij", "gh ij ef"), ("ab gh", "ab"), ("cd ef gh ij", "cd")]
    models, src, ref = models_with_shortlist(tmp_path, pairs, top_k=1, frequent=0)
    results = bench.main(
        ["--smoke", "--dat", str(models["dat"]), "--at", str(models["at"])]
        + ["--src", str(src), "--ref", str(ref), "--precisions", "fp32", "int8"]
        + ["--upsample-ratios", "3", "--prune-thresholds", "0.001"]
        + ["--onnx-precisions", "--memory-batches", "0", "--json", str(tmp_path / "out.json")]
    )
    names = set(results)
    for name in (
        "DAT lookahead fp32 +sl +prune 0.001",
        "DAT joint-viterbi int8 λ=3 +prune 0.001",
        "CT2 beam5 int8 +vmap",
        "CT2 greedy int8 =ref len",
        "CT2 beam5 int8 +vmap =ref len",
    ):
        assert name in names, name
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(models["spm"]))
    lengths = [len(sp.encode(line)) for line in ref.read_text(encoding="utf-8").splitlines()]
    for beam in ("greedy", "beam5"):
        for vmap in ("", " +vmap"):
            outputs = results[f"CT2 {beam} int8{vmap} =ref len"]["outputs"]
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


PAIRS = [("ab cd ef", "ab cd"), ("gh ij", "gh ij ef"), ("ab gh", "ab"), ("cd ef gh ij", "cd")]


# The ONNX tests read the test run's fp32 and int8 exports of the tiny random DAT
# (conftest.dat_onnx: ``DIR/fp32``, ``DIR/int8``; an export takes ≈ 20 s of CPU time).
# random_models is seeded, so the DAT that each test builds is the exported one.


@needs_ct2
@needs_ort
def test_smoke_mode_onnx_rows_memory_and_disk(tmp_path, dat_onnx):
    """The ONNX Runtime rows (exports from ``--onnx-dir``) give the torch rows' fp32 outputs;
    every row has a peak memory from its own child process (the ORT ones without torch) and
    the size of the directory it loads; ``--profile fastest`` profiles one DAT or ORT row."""
    bench = load_bench()
    models, src, ref = models_with_shortlist(tmp_path, PAIRS, top_k=1, frequent=0)
    keep = r"^(ORT .*|DAT \S+ fp32|CT2 greedy int8 =ref len)$"
    results = bench.main(
        ["--smoke", "--dat", str(models["dat"]), "--at", str(models["at"])]
        + ["--src", str(src), "--ref", str(ref), "--precisions", "fp32", "--prune-thresholds"]
        + ["--onnx-dir", str(dat_onnx["dir"]), "--only", keep, "--profile", "fastest"]
    )
    strategies = ("greedy", "lookahead", "joint-viterbi")
    expected = {f"ORT {s} {p}" for s in strategies for p in ("fp32", "int8")}
    expected |= {f"DAT {s} fp32" for s in strategies} | {"CT2 greedy int8 =ref len"}
    assert set(results) == expected
    for s in strategies:
        assert results[f"ORT {s} fp32"]["outputs"] == results[f"DAT {s} fp32"]["outputs"], s
        assert results[f"ORT {s} int8"]["bleu"] >= 0
    profiled = [name for name, x in results.items() if "profile" in x]
    assert len(profiled) == 1 and not profiled[0].startswith("CT2")
    for name, x in results.items():
        memory = x["memory"]
        assert 0 < memory["base_mib"] <= memory["peak_mib"], name
        assert memory["torch"] == (not name.startswith("ORT")), name
    # each child's own peak, not the benchmark's (Linux carries ru_maxrss over exec): without
    # torch the ORT children start smaller, and loading and running a system takes memory
    base = {name: x["memory"]["base_mib"] for name, x in results.items()}
    assert max(v for k, v in base.items() if k.startswith("ORT")) < min(
        v for k, v in base.items() if not k.startswith("ORT")
    )
    assert all(x["memory"]["peak_mib"] > x["memory"]["base_mib"] for x in results.values())
    for p in ("fp32", "int8"):
        files = [f for f in (dat_onnx["dir"] / p).rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files) / 2**20
        assert results[f"ORT lookahead {p}"]["disk_mib"] == pytest.approx(size)
        assert size > (dat_onnx["dir"] / p / "dat.onnx").stat().st_size / 2**20 * 0.99


@needs_ort
def test_onnx_replicas_translate_as_the_session_in_process(tmp_path, monkeypatch, dat_onnx):
    """``inter 2`` for an ORT row: two one-thread worker processes holding a session each give
    the outputs of the session in this process on the same halves of each batch. (int8: ONNX
    Runtime's dynamic quantization scales activations per tensor, i.e. over the whole batch,
    so a sentence's int8 output may depend on its batch mates; fp32 outputs do not.)"""
    from fadat.data.spm import encode_source

    bench = load_bench()
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    models, src, _ = models_with_shortlist(tmp_path, PAIRS, top_k=1, frequent=0)
    _, sp = bench.load_model(models["dat"], "cpu")
    sources = [encode_source(sp, x) for x in src.read_text(encoding="utf-8").splitlines()]
    dirs = {p: str(dat_onnx["dir"] / p) for p in ("fp32", "int8")}
    pool = bench.Replicas(str(models["dat"]), 2, [], [], list(dirs.values()))
    try:
        for precision, directory in dirs.items():
            for strategy in ("greedy", "joint-viterbi"):
                here = bench.ort_translate(bench.ort_engine(directory, 1), strategy, None)
                there = pool.translate_onnx(directory, strategy, None)
                halves = here(sources[:2]) + here(sources[2:])
                assert there(sources) == halves, (precision, strategy)
                if precision == "fp32":
                    assert halves == here(sources), strategy
                assert there(sources[:1]) == here(sources[:1])
    finally:
        pool.close()


@needs_ort
def test_onnx_node_parts(dat_onnx):
    """Every node of the fp32 and the int8 export has a part, and the nodes whose place is
    known fall there: one fused attention per encoder layer in the encoder and two per decoder
    layer in the decoder, the top-k in the token head; int8's quantized products (which carry no
    scope) in the part of the fp32 product each replaces (ONNX Runtime's quantizer names it
    ``NAME_quant``)."""
    import onnx

    from fadat.models.directory import read_model_metadata

    bench = load_bench()
    config = read_model_metadata(dat_onnx["dat"])["config"]
    parts, ops = {}, {}
    for precision in ("fp32", "int8"):
        graph = dat_onnx["dir"] / precision / "dat.onnx"
        nodes = onnx.load(str(graph), load_external_data=False).graph.node
        parts[precision] = bench.onnx_node_parts(graph)
        ops[precision] = {n.name: n.op_type for n in nodes}
        assert set(parts[precision]) == set(ops[precision])
        assert set(parts[precision].values()) == {"encoder", "decoder", "links head", "token head"}
        by_op: dict[str, Counter] = {}
        for name, op in ops[precision].items():
            by_op.setdefault(op, Counter())[parts[precision][name]] += 1
        assert by_op["MultiHeadAttention"] == Counter(
            encoder=config["encoder_layers"], decoder=2 * config["decoder_layers"]
        ), (precision, by_op["MultiHeadAttention"])
        assert by_op["TopK"] == Counter({"token head": 1}), precision
    quantized = [name for name, op in ops["int8"].items() if op == "MatMulInteger"]
    assert quantized
    seen = Counter()
    for name in quantized:
        original = name.removesuffix("_quant")
        assert ops["fp32"][original] in ("MatMul", "Gemm"), name
        assert parts["int8"][name] == parts["fp32"][original], name
        seen[parts["int8"][name]] += 1
    assert {"encoder", "decoder", "token head"} <= set(seen), seen


@needs_ct2
@needs_ort
def test_profiles_and_random_at(tmp_path, dat_onnx):
    """``--profile ROW`` for a torch and an ORT row: per-op times that fit in the measured
    time; ``--at random``: an AT of the DAT's shape, only forced rows, of the references'
    lengths."""
    from fadat.models.directory import read_model_metadata

    bench = load_bench()
    models, src, ref = models_with_shortlist(tmp_path, PAIRS, top_k=1, frequent=0)
    base = ["--smoke", "--dat", str(models["dat"]), "--src", str(src), "--ref", str(ref)]
    base += ["--precisions", "fp32", "--prune-thresholds", "--onnx-dir", str(dat_onnx["dir"])]
    for row in ("ORT lookahead int8", "DAT lookahead fp32"):
        out = bench.main([*base, "--at", str(models["at"]), "--profile", row])[row]
        assert out["ms_per_sentence"] > 0 and out["ops_ms"], row
        total = sum(ms for ms, *_ in map(_as_tuple, out["ops_ms"].values()))
        assert 0 < total <= out["ms_per_sentence"] * 1.05, row
        if row.startswith("ORT"):
            assert out["session_run_ms"] <= out["ms_per_sentence"]
            assert "DynamicQuantizeMatMul" in out["ops_ms"] or "MatMulInteger" in out["ops_ms"]
            # the same kernel time, split by part of the network instead of by op type
            parts = out["parts_ms"]
            assert {"encoder", "decoder", "links head", "token head"} <= set(parts), parts
            assert all(ms > 0 for ms in parts.values()), parts
            assert sum(parts.values()) == pytest.approx(total, rel=1e-6), (parts, total)
    with pytest.raises(SystemExit, match="no such row"):
        bench.main([*base, "--at", str(models["at"]), "--profile", "DAT nothing"])
    # --profile-batch: the smoke mode's 4 batch sentences in length-sorted batches of 2
    for row in ("ORT lookahead int8", "DAT lookahead fp32"):
        argv = [*base, "--at", str(models["at"]), "--profile", row, "--profile-batch", "2"]
        out = bench.main(argv)[row]
        assert out["batch"] == 2 and out["ms_per_sentence"] > 0 and out["ops_ms"], row
        total = sum(ms for ms, *_ in map(_as_tuple, out["ops_ms"].values()))
        assert 0 < total <= out["ms_per_sentence"] * 1.05, row
    with pytest.raises(SystemExit, match="--profile-batch must be >= 1"):
        bench.main([*base, "--at", str(models["at"]), "--profile", row, "--profile-batch", "0"])

    at = bench.build_random_at(models["dat"], tmp_path / "at-random")
    dat_config = read_model_metadata(models["dat"])["config"]
    at_meta = read_model_metadata(at)
    assert at_meta["model_type"] == "at"
    for key in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "ffn_dim"):
        assert at_meta["config"][key] == dat_config[key], key
    results = bench.main(
        [*base, "--at", "random", "--onnx-precisions", "--only", "^CT2", "--memory-batches", "0"]
    )
    assert set(results) == {
        f"CT2 {b} int8{v} =ref len" for b in ("greedy", "beam5") for v in ("", " +vmap")
    }
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(models["spm"]))
    lengths = [len(sp.encode(line)) for line in ref.read_text(encoding="utf-8").splitlines()]
    for x in results.values():
        assert [len(y) for y in x["outputs"]] == lengths


def two_designs(tmp_path):
    """The tiny random DAT (1 + 1 layers, λ = 4) and a deeper one of the same vocabulary (2
    encoder + 2 decoder layers, trained λ range [2, 6], decoding λ 3), ``PAIRS`` in src.txt /
    ref.txt. Returns (``{"tiny": dir, "deep": dir}``, src, ref)."""
    from test_translate import random_models

    from fadat.models.config import make_config
    from fadat.models.dat import DATModel

    models = random_models(str(tmp_path / "random"))
    import torch

    torch.manual_seed(1)
    config = make_config(
        "tiny",
        16,
        encoder_layers=2,
        decoder_layers=2,
        max_source_positions=8,
        init_std=0.5,
        dropout=0.0,
        upsample_ratio_range=[2.0, 6.0],
        decode_upsample_ratio=3.0,
    )
    DATModel(config).save_pretrained(tmp_path / "deep", spm_model=models["spm"])
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(x + "\n" for x, _ in PAIRS), encoding="utf-8")
    ref.write_text("".join(y + "\n" for _, y in PAIRS), encoding="utf-8")
    return {"tiny": models["dat"], "deep": tmp_path / "deep"}, src, ref


@needs_ct2
def test_several_named_dats_in_one_run(tmp_path):
    """Two named designs of different depths and the random AT in one smoke run: every DAT row
    of both designs at every λ, named after its design, decoded by its own model at its λ (the
    outputs equal the torch path's on the design's sources); the JSON says what each row is."""
    import json

    from fadat.data.spm import encode_source
    from fadat.models.inference import with_precision

    bench = load_bench()
    dats, src, ref = two_designs(tmp_path)
    out = tmp_path / "out.json"
    results = bench.main(
        ["--smoke", "--dat", f"deep={dats['deep']}", "--dat", f"tiny={dats['tiny']}"]
        + ["--at", "random", "--src", str(src), "--ref", str(ref), "--precisions", "int8"]
        + ["--upsample-ratios", "2", "6", "--prune-thresholds", "--onnx-precisions"]
        + ["--memory-batches", "0", "--json", str(out)]
    )
    strategies = ("greedy", "lookahead", "joint-viterbi")
    lams = ("", " λ=2", " λ=6")
    expected = {f"{d}: DAT {s} int8{lam}" for d in dats for s in strategies for lam in lams}
    expected |= {"CT2 greedy int8 =ref len", "CT2 beam5 int8 =ref len"}
    assert set(results) == expected
    names = list(results)  # the table's order: design by design, then CTranslate2
    assert names[0].startswith("deep: ") and names[-1].startswith("CT2")

    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["run"]["designs"] == {"deep": str(dats["deep"]), "tiny": str(dats["tiny"])}
    assert saved["run"]["at"] == "AT_RANDOM" and saved["run"]["test_sentences"] == len(PAIRS)
    own = {"tiny": 4.0, "deep": 3.0}  # each model's decoding λ
    lines = src.read_text(encoding="utf-8").splitlines()
    for design, directory in dats.items():
        model, sp = bench.load_model(directory, "cpu")
        model = with_precision(model, "int8")
        sources = [encode_source(sp, x) for x in lines]
        order = sorted(range(len(sources)), key=lambda i, s=sources: len(s[i]))
        batches = [order[k : k + 2] for k in range(0, len(order), 2)]  # --smoke: batches of 2
        for ratio, lam in ((None, ""), (2.0, " λ=2"), (6.0, " λ=6")):
            for strategy in strategies:
                name = f"{design}: DAT {strategy} int8{lam}"
                row = saved[name]
                assert row["design"] == design and row["model"] == str(directory)
                assert (row["system"], row["strategy"], row["precision"]) == (
                    "torch",
                    strategy,
                    "int8",
                )
                assert row["upsample_ratio"] == ratio
                assert row["lambda"] == (own[design] if ratio is None else ratio)
                low = row["latency_ms"][1]
                assert 0 < low <= row["latency_ms"][0] <= row["latency_ms"][2], name
                assert row["sent_s"][0] > 0 and row["threads"] == 1
                assert 0 <= row["tok_bleu"] <= 100, name
                run = bench.dat_translate(model, strategy, None, None, ratio)
                here = [None] * len(sources)
                for batch in batches:  # as the bench batches (int8 scales per batch)
                    for i, y in zip(batch, run([sources[i] for i in batch]), strict=True):
                        here[i] = y
                assert results[name]["outputs"] == here, name
    for beam in ("greedy", "beam5"):
        row = saved[f"CT2 {beam} int8 =ref len"]
        assert row["design"] is None and row["system"] == "ctranslate2" and row["forced"]
        assert row["strategy"] == beam and "tok_bleu" not in row and row["latency_ms"][0] > 0


@needs_ct2
def test_a_bare_dat_keeps_the_row_names(tmp_path):
    """``--dat DIR`` (no name): the rows are named as before several DATs could be given, and
    the JSON's ``design`` is null."""
    import json

    bench = load_bench()
    dats, src, ref = two_designs(tmp_path)
    out = tmp_path / "out.json"
    results = bench.main(
        ["--smoke", "--dat", str(dats["tiny"]), "--at", "random", "--src", str(src)]
        + ["--ref", str(ref), "--precisions", "int8", "--upsample-ratios", "3"]
        + ["--prune-thresholds", "--onnx-precisions", "--memory-batches", "0"]
        + ["--only", "^DAT lookahead|^CT2 beam5", "--json", str(out)]
    )
    assert list(results) == [
        "DAT lookahead int8",
        "DAT lookahead int8 λ=3",
        "CT2 beam5 int8 =ref len",
    ]
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["DAT lookahead int8"]["design"] is None
    assert saved["DAT lookahead int8 λ=3"]["lambda"] == 3.0
    assert saved["run"]["designs"] == {}


def pieces_lm(tmp_path, spm_path):
    """The tiny ARPA LM of tests/test_lm_cli.py over the tiny models' pieces: it prefers
    ``test_lm_cli.FAVOURITE`` (``▁ab``). Returns (the file, that piece)."""
    from test_lm_cli import FAVOURITE, pieces, write_arpa

    words = [w for w in pieces(spm_path) if not w.startswith("<")]
    return write_arpa(tmp_path / "pieces.arpa", words), FAVOURITE


def reference_beam(directory, precision, ratio, options, sources):
    """The beam search's outputs of the bench's batches (``--smoke``: length-sorted pairs) by
    hand: the network's full token log-probabilities (``graph_outputs`` in the precision of
    ``with_precision``) and ``fadat.decoding.decode(..., "beam", **options)``."""
    import torch

    from fadat.data.contract import pad_sequences
    from fadat.decoding import decode
    from fadat.models.directory import load_model
    from fadat.models.inference import precision_autocast, with_precision

    model, _ = load_model(directory, "cpu")
    model = with_precision(model, precision)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out = [None] * len(sources)
    for batch in [order[k : k + 2] for k in range(0, len(order), 2)]:
        with torch.inference_mode(), precision_autocast(model):
            graph = model.graph_outputs(pad_sequences([sources[i] for i in batch]), ratio)
        for i, h in zip(batch, decode(*graph, "beam", **options), strict=True):
            out[i] = list(h.tokens)
    return out


@needs_ct2
@needs_kenlm
def test_beam_rows_with_and_without_an_lm(tmp_path):
    """``--beam --lm FILE --gamma G``: per design, precision and λ a ``DAT beam`` and a ``DAT
    beam+LM`` row, whose outputs are the beam search's on the full token head of that precision
    (without the LM, and with it at γ read by the design's own pieces), timed and scored; the
    JSON's ``strategy``, ``lm``, ``gamma`` on every row; the LM moves outputs toward its word."""
    import json

    import kenlm

    from fadat.data.spm import encode_source
    from fadat.translation.language_model import lm_words

    bench = load_bench()
    dats, src, ref = two_designs(tmp_path)
    arpa, favourite = pieces_lm(tmp_path, dats["tiny"] / "spm.model")
    out = tmp_path / "out.json"
    results = bench.main(
        ["--smoke", "--dat", f"deep={dats['deep']}", "--dat", f"tiny={dats['tiny']}"]
        + ["--at", "random", "--src", str(src), "--ref", str(ref), "--precisions", "fp32", "int8"]
        + ["--upsample-ratios", "2", "--prune-thresholds", "--onnx-precisions"]
        + ["--memory-batches", "0", "--beam", "--lm", str(arpa), "--gamma", "3"]
        + ["--only", "beam|^tiny: DAT lookahead int8$", "--json", str(out)]
    )
    kinds, precisions, lams = ("beam", "beam+LM"), ("fp32", "int8"), ("", " λ=2")
    expected = {
        f"{d}: DAT {k} {p}{lam}" for d in dats for k in kinds for p in precisions for lam in lams
    }
    expected |= {"tiny: DAT lookahead int8", "CT2 beam5 int8 =ref len"}
    assert set(results) == expected
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert (saved["run"]["beam"], saved["run"]["lm"], saved["run"]["gamma"]) == (
        True,
        str(arpa),
        3.0,
    )
    assert saved["run"]["beam_size"] == 100  # the strategy's default, without --beam-size
    for name in ("tiny: DAT lookahead int8", "CT2 beam5 int8 =ref len"):
        assert (saved[name]["lm"], saved[name]["gamma"]) == (None, None), name
        assert saved[name]["beam_size"] is None, name
    own = {"tiny": 4.0, "deep": 3.0}
    lm = kenlm.Model(str(arpa))
    lines = src.read_text(encoding="utf-8").splitlines()
    favourites = {"beam": 0, "beam+LM": 0}
    for design, directory in dats.items():
        model, sp = bench.load_model(directory, "cpu")
        sources = [encode_source(sp, x) for x in lines]
        with_lm = {"lm": lm, "lm_words": lm_words(sp), "gamma": 3.0}
        for kind in kinds:
            for precision in precisions:
                for ratio, lam in ((None, ""), (2.0, " λ=2")):
                    name = f"{design}: DAT {kind} {precision}{lam}"
                    row = saved[name]
                    assert (row["design"], row["system"], row["strategy"]) == (
                        design,
                        "torch",
                        "beam",
                    ), name
                    assert row["precision"] == precision and row["upsample_ratio"] == ratio
                    assert row["lambda"] == (own[design] if ratio is None else ratio)
                    assert (row["lm"], row["gamma"]) == (
                        (str(arpa), 3.0) if kind == "beam+LM" else (None, None)
                    ), name
                    assert (row["shortlist"], row["prune"]) == (False, None)
                    assert row["latency_ms"][0] > 0 and row["sent_s"][0] > 0, name
                    assert 0 <= row["tok_bleu"] <= 100, name
                    assert "--strategy beam" in row["command"]
                    assert row["beam_size"] == 100 and "--beam-size" not in row["command"]
                    assert ("--lm" in row["command"]) == (kind == "beam+LM")
                    options = with_lm if kind == "beam+LM" else {}
                    outputs = results[name]["outputs"]
                    want = reference_beam(directory, precision, ratio, options, sources)
                    assert outputs == want, name
                    favourites[kind] += sum(
                        sp.id_to_piece(t) == favourite for y in outputs for t in y
                    )
    assert favourites["beam+LM"] > favourites["beam"]


@needs_kenlm
def test_dat_replicas_run_the_beam_search(tmp_path, monkeypatch):
    """``inter 2`` of the beam rows: two one-thread workers, each holding the LM, give the
    outputs of the beam search in this process, without and with the LM, at the default beam
    and at beam 1 (fp32: int8 scales activations per batch, so a batch split in two may decode
    otherwise)."""
    from fadat.data.spm import encode_source
    from fadat.translation.language_model import language_model_options

    bench = load_bench()
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    dats, src, _ = two_designs(tmp_path)
    arpa, _ = pieces_lm(tmp_path, dats["tiny"] / "spm.model")
    model, sp = bench.load_model(dats["tiny"], "cpu")
    sources = [encode_source(sp, x) for x in src.read_text(encoding="utf-8").splitlines()]
    # beam 1 decodes these sources otherwise than the default beam 100: a beam size lost on the
    # way to the workers shows
    narrow = bench.beam_translate(model, {"beam_size": 1})(sources)
    assert narrow != bench.beam_translate(model, {})(sources)
    pool = bench.Replicas(str(dats["tiny"]), 2, ["fp32"], [], lm=str(arpa))
    try:
        for gamma, ratio, size in (
            (None, None, 100),
            (3.0, None, 100),
            (3.0, 2.0, 100),
            (None, None, 1),
            (3.0, None, 1),
        ):
            options = {"beam_size": size}
            if gamma is not None:
                options.update(gamma=gamma, **language_model_options(str(arpa), model, sp))
            here = bench.beam_translate(model, options, ratio)
            there = pool.translate_beam("fp32", gamma, ratio, size)
            assert there(sources) == here(sources), (gamma, ratio, size)
    finally:
        pool.close()


@needs_ct2
@needs_kenlm
def test_beam_row_of_a_bare_dat_and_its_memory(tmp_path):
    """A bare ``--dat``'s rows are ``DAT beam+LM int8`` (γ 1 by default), and its memory probe
    (bench/rss_probe.py) loads the model and the LM in a child process."""
    bench = load_bench()
    dats, src, ref = two_designs(tmp_path)
    arpa, _ = pieces_lm(tmp_path, dats["tiny"] / "spm.model")
    results = bench.main(
        ["--smoke", "--dat", str(dats["tiny"]), "--at", "random", "--src", str(src)]
        + ["--ref", str(ref), "--precisions", "int8", "--prune-thresholds", "--onnx-precisions"]
        + ["--lm", str(arpa), "--only", "^DAT beam"]
    )
    assert list(results) == ["DAT beam+LM int8"]
    row = results["DAT beam+LM int8"]
    assert (row["strategy"], row["lm"], row["gamma"]) == ("beam", str(arpa), 1.0)
    assert row["memory"]["torch"] and row["memory"]["peak_mib"] > row["memory"]["base_mib"] > 0


def test_beam_options_are_refused_before_any_work(tmp_path, capsys):
    """``--gamma`` without ``--lm``; ``--beam-size`` without ``--beam`` or ``--lm``, or below 1
    (argparse's error); a missing LM file; an LM that is not of a design's pieces (named after
    the design); a γ that is not a finite number: one message each."""
    bench = load_bench()
    dats, src, ref = two_designs(tmp_path)
    base = ["--smoke", "--dat", f"tiny={dats['tiny']}", "--at", "random"]
    base += ["--src", str(src), "--ref", str(ref), "--onnx-precisions", "--memory-batches", "0"]
    with pytest.raises(SystemExit, match="--gamma weighs the --lm language model"):
        bench.main([*base, "--beam", "--gamma", "0.5"])
    with pytest.raises(SystemExit, match="--beam-size sets the beam of the beam search rows"):
        bench.main([*base, "--beam-size", "20"])
    capsys.readouterr()
    for value in ("0", "-3", "2.5"):
        with pytest.raises(SystemExit) as exit_info:
            bench.main([*base, "--beam", "--beam-size", value])
        assert exit_info.value.code == 2, value  # argparse's usage error
        assert "argument --beam-size: " in capsys.readouterr().err, value
    if importlib.util.find_spec("kenlm") is None:
        return
    from test_lm_cli import write_arpa

    missing = tmp_path / "missing.arpa"
    with pytest.raises(SystemExit, match="missing.arpa: language model \\(--lm\\) not found"):
        bench.main([*base, "--lm", str(missing)])
    words = write_arpa(tmp_path / "words.arpa", ["zz", "yy"], favourite="zz")
    with pytest.raises(SystemExit, match="^--dat tiny: .*words.arpa: only 0 of the model's"):
        bench.main([*base, "--lm", str(words)])
    arpa, _ = pieces_lm(tmp_path, dats["tiny"] / "spm.model")
    with pytest.raises(SystemExit, match="gamma.*finite"):
        bench.main([*base, "--lm", str(arpa), "--gamma", "nan"])


def test_dat_values_name_designs(tmp_path):
    """``--dat`` values: ``NAME=DIR`` names a design; a bare directory (also one whose name
    holds '=') does not; several values must all be named, each name once."""
    bench = load_bench()
    odd = tmp_path / "a=b"
    odd.mkdir()
    [d] = bench.parse_designs([str(odd)])
    assert (d.name, d.directory, d.prefix) == (None, odd, "")
    [d] = bench.parse_designs(["runs/x/model"])
    assert (d.name, d.directory) == (None, Path("runs/x/model"))
    designs = bench.parse_designs(["5x1-range=runs/m/5x1-range-s1", "base=runs/m/base-s1"])
    assert [(d.name, str(d.directory), d.prefix) for d in designs] == [
        ("5x1-range", "runs/m/5x1-range-s1", "5x1-range: "),
        ("base", "runs/m/base-s1", "base: "),
    ]
    with pytest.raises(SystemExit, match="name every DAT"):
        bench.parse_designs(["base=runs/a", "runs/b"])
    with pytest.raises(SystemExit, match="given twice"):
        bench.parse_designs(["base=runs/a", "base=runs/b"])
    with pytest.raises(SystemExit, match="needs a directory"):
        bench.parse_designs(["base="])


def _as_tuple(value):
    """A profile's per-op entry: torch gives (ms, calls), ORT gives ms."""
    return value if isinstance(value, (tuple, list)) else (value,)


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16 {extra}
bogomips\t: 4000.00

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "amx_bf16 amx_tile amx_int8 avx_vnni",
            dict.fromkeys(
                ("amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni"),
                True,
            ),
        ),
        ("amx_bf16 amx_int8", {"avx512_bf16": True, "avx512_vnni": True}),  # no tiles: no AMX
        ("", {"avx512_bf16": True, "avx512_vnni": True}),
    ],
)
def test_cpu_features_read_the_first_processors_flags(tmp_path, extra, expected):
    from fadat.process import CPU_FEATURES, cpu_features, cpu_model, describe_cpu

    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(extra=extra), encoding="utf-8")
    features = cpu_features(path, use_torch=False)
    assert list(features) == list(CPU_FEATURES)
    assert features == {name: expected.get(name, name == "avx2") for name in CPU_FEATURES}
    assert cpu_model(path) == "Intel(R) Xeon(R) Platinum 8480+"
    line = describe_cpu(path)
    assert line.startswith("Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143); ")
    shown = cpu_features(path)  # torch's helpers where it has them: this machine's answers
    assert line.endswith(", ".join(f"{k} {'yes' if v else 'no'}" for k, v in shown.items()))


def test_cpu_features_without_cpuinfo_and_with_torch(tmp_path):
    """No cpuinfo (not Linux): no flags, a model name from the platform; with torch, its
    helpers answer the features they cover and the flags the others."""
    import torch

    from fadat.process import CPU_FEATURES, cpu_features, cpu_model

    missing = tmp_path / "none"
    assert not any(cpu_features(missing, use_torch=False).values())
    assert cpu_model(missing)
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(extra="avx_vnni amx_tile amx_int8"), encoding="utf-8")
    features = cpu_features(path)
    for name, (helper, _) in CPU_FEATURES.items():
        if helper is not None and hasattr(torch.cpu, helper):
            assert features[name] == bool(getattr(torch.cpu, helper)()), name
    assert features["avx_vnni"] is True
    assert features["amx_int8"] == features["amx_tile"]


@needs_ct2
@needs_ort
@needs_kenlm
def test_ort_beam_rows_with_and_without_an_lm(tmp_path, dat_onnx):
    """``--beam --lm FILE`` with ONNX Runtime exports: per export an ``ORT beam`` and an ``ORT
    beam+LM`` row, whose fp32 outputs are the torch ``DAT beam`` rows' (the same search on the
    export's top tokens) and whose int8 outputs are the engine's on the bench's batches; the
    JSON says what each row is, its memory probe imports no torch; the LM moves the outputs
    toward its word. An export of format version 1 stops such a run."""
    import json

    from fadat.data.spm import encode_source

    bench = load_bench()
    models, src, ref = models_with_shortlist(tmp_path, PAIRS, top_k=1, frequent=0)
    arpa, favourite = pieces_lm(tmp_path, models["spm"])
    out = tmp_path / "out.json"
    results = bench.main(
        ["--smoke", "--dat", str(models["dat"]), "--at", str(models["at"]), "--src", str(src)]
        + ["--ref", str(ref), "--precisions", "fp32", "--prune-thresholds"]
        + ["--onnx-dir", str(dat_onnx["dir"]), "--beam", "--lm", str(arpa), "--gamma", "3"]
        + ["--memory-batches", "1", "--only", "^(DAT|ORT) beam", "--json", str(out)]
    )
    kinds = ("beam", "beam+LM")
    expected = {f"ORT {k} {p}" for k in kinds for p in ("fp32", "int8")}
    expected |= {f"DAT {k} fp32" for k in kinds}
    assert set(results) == expected
    saved = json.loads(out.read_text(encoding="utf-8"))
    _, sp = bench.load_model(models["dat"], "cpu")
    sources = [encode_source(sp, x) for x, _ in PAIRS]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    favourites = dict.fromkeys(kinds, 0)
    for kind in kinds:
        gamma = 3.0 if kind == "beam+LM" else None
        assert results[f"ORT {kind} fp32"]["outputs"] == results[f"DAT {kind} fp32"]["outputs"]
        engine = bench.ort_engine(str(dat_onnx["dir"] / "int8"), 1)
        options = {} if gamma is None else {"gamma": gamma, "lm": str(arpa)}
        want = [None] * len(sources)
        for pair in [order[k : k + 2] for k in range(0, len(order), 2)]:  # --smoke: pairs
            hyps = engine.translate_ids([sources[i] for i in pair], "beam", **options)
            for i, h in zip(pair, hyps, strict=True):
                want[i] = h.tokens
        assert results[f"ORT {kind} int8"]["outputs"] == want, kind
        for precision in ("fp32", "int8"):
            name = f"ORT {kind} {precision}"
            row = saved[name]
            assert (row["system"], row["strategy"], row["precision"]) == (
                "onnxruntime",
                "beam",
                precision,
            )
            assert (row["lm"], row["gamma"]) == ((str(arpa), 3.0) if gamma else (None, None))
            assert "--engine onnxruntime" in row["command"] and "--strategy beam" in row["command"]
            assert ("--lm" in row["command"]) == (gamma is not None)
            assert row["latency_ms"][0] > 0 and 0 <= row["tok_bleu"] <= 100, name
            assert row["memory"]["torch"] is False, name
            favourites[kind] += sum(
                sp.id_to_piece(t) == favourite for y in results[name]["outputs"] for t in y
            )
    assert favourites["beam+LM"] > favourites["beam"]
    old = tmp_path / "v1"
    old.mkdir()
    meta = json.loads((dat_onnx["dir"] / "fp32" / "metadata.json").read_text(encoding="utf-8"))
    (old / "metadata.json").write_text(json.dumps(meta | {"format_version": 1}))
    with pytest.raises(SystemExit, match="format version 1 .* export it again"):
        bench.check_beam_export(old)
    bench.check_beam_export(dat_onnx["dir"] / "int8")


@needs_ct2
@needs_ort
@needs_kenlm
def test_beam_size_reaches_every_beam_row(tmp_path, monkeypatch, dat_onnx):
    """``--beam-size 1``: the torch and ONNX Runtime beam rows, without and with the LM, keep
    their names and search with beam 1: their translate functions are given ``beam_size=1``
    and the rows without the LM give the beam-1 search's outputs (which on these sentences are
    not the default beam's); their commands say ``--beam-size 1`` as ``fadat translate`` reads
    it, the JSON ``beam_size`` 1; their memory probes (bench/rss_probe.py) carry it and search
    with it."""
    import json
    import shlex

    from fadat.cli import build_parser
    from fadat.data.spm import encode_source
    from fadat.engine.runtime import OnnxDAT

    bench = load_bench()
    models, src, ref = models_with_shortlist(tmp_path, PAIRS, top_k=1, frequent=0)
    arpa, _ = pieces_lm(tmp_path, models["spm"])
    sizes = {"torch": [], "onnx": []}  # the beam_size of each beam search set up
    real = {"torch": bench.beam_translate, "onnx": bench.ort_beam_translate}

    def spy(kind):
        def make(first, options, ratio=None):
            sizes[kind].append(options.get("beam_size"))
            return real[kind](first, options, ratio)

        return make

    monkeypatch.setattr(bench, "beam_translate", spy("torch"))
    monkeypatch.setattr(bench, "ort_beam_translate", spy("onnx"))
    specs = []  # each row's memory probe, run below in this process rather than in a child

    def record(spec, work):
        specs.append(spec)
        return {}

    monkeypatch.setattr(bench, "peak_memory", record)
    out = tmp_path / "out.json"
    results = bench.main(
        ["--smoke", "--dat", str(models["dat"]), "--at", str(models["at"]), "--src", str(src)]
        + ["--ref", str(ref), "--precisions", "fp32", "--prune-thresholds"]
        + ["--onnx-dir", str(dat_onnx["dir"]), "--onnx-precisions", "fp32"]
        + ["--beam", "--lm", str(arpa), "--gamma", "3", "--beam-size", "1"]
        + ["--memory-batches", "1", "--only", "^(DAT|ORT) beam", "--json", str(out)]
    )
    names = ["DAT beam fp32", "DAT beam+LM fp32", "ORT beam fp32", "ORT beam+LM fp32"]
    assert list(results) == names
    assert sizes == {"torch": [1, 1], "onnx": [1, 1]}  # one translate function per row

    _, sp = bench.load_model(models["dat"], "cpu")
    sources = [encode_source(sp, x) for x, _ in PAIRS]
    narrow = reference_beam(models["dat"], "fp32", None, {"beam_size": 1}, sources)
    assert narrow != reference_beam(models["dat"], "fp32", None, {}, sources)
    assert results["DAT beam fp32"]["outputs"] == narrow
    assert results["ORT beam fp32"]["outputs"] == narrow

    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["run"]["beam_size"] == 1
    translate = build_parser("translate")
    for name in names:
        assert saved[name]["beam_size"] == 1, name
        command = saved[name]["command"].replace("--threads T", "--threads 1")
        args = translate.parse_args(shlex.split(command.rpartition("; ")[2])[1:])
        assert (args.strategy, args.beam_size) == ("beam", 1), name

    assert [spec["beam_size"] for spec in specs] == [1, 1, 1, 1]
    for kind in sizes:
        sizes[kind].clear()
    real_translate_ids = OnnxDAT.translate_ids

    def engine_spy(engine, batch, strategy="lookahead", ratio=None, **options):
        sizes["onnx"].append(options.get("beam_size"))
        return real_translate_ids(engine, batch, strategy, ratio, **options)

    monkeypatch.setattr(OnnxDAT, "translate_ids", engine_spy)
    monkeypatch.setattr(sys, "path", list(sys.path))  # rss_probe puts bench/ on it
    loader = importlib.util.spec_from_file_location("rss_probe", SCRIPT.parent / "rss_probe.py")
    rss_probe = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(rss_probe)
    for spec in specs:
        assert rss_probe.probe(spec)["peak_mib"] > 0
    batches = len(specs[0]["batches"])  # each probe translates its batches once
    assert sizes == {"torch": [1, 1], "onnx": [1] * 2 * batches}


@needs_ort
@needs_kenlm
def test_onnx_replicas_run_the_beam_search(tmp_path, monkeypatch, dat_onnx):
    """``inter 2`` of the ORT beam rows: two one-thread workers, each holding the export's
    session and the LM, give the outputs of the engine in this process (fp32), without and
    with the LM, at the default beam and at beam 1."""
    from fadat.data.spm import encode_source

    bench = load_bench()
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    models, src, _ = models_with_shortlist(tmp_path, PAIRS, top_k=1, frequent=0)
    arpa, _ = pieces_lm(tmp_path, models["spm"])
    _, sp = bench.load_model(models["dat"], "cpu")
    sources = [encode_source(sp, x) for x in src.read_text(encoding="utf-8").splitlines()]
    directory = str(dat_onnx["dir"] / "fp32")
    engine = bench.ort_engine(directory, 1)
    # as for torch: beam 1 decodes these sources otherwise than beam 100
    narrow = bench.ort_beam_translate(engine, {"beam_size": 1})(sources)
    assert narrow != bench.ort_beam_translate(engine, {})(sources)
    pool = bench.Replicas(str(models["dat"]), 2, [], [], [directory], lm=str(arpa))
    try:
        for gamma, size in ((None, 100), (3.0, 100), (None, 1), (3.0, 1)):
            options = {"beam_size": size}
            if gamma is not None:
                options.update(gamma=gamma, lm=str(arpa))
            here = bench.ort_beam_translate(engine, options)
            there = pool.translate_onnx_beam(directory, gamma, None, size)
            assert there(sources) == here(sources), (gamma, size)
    finally:
        pool.close()


@needs_ct2
@needs_ort
def test_ort_shortlist_rows(tmp_path, dat_onnx, dat_onnx_shortlist):
    """``--shortlist FILE`` adds the ``ORT ... +sl`` rows, of exports made with it (here from
    ``--onnx-dir``: ``DIR/PRECISION-sl``): their fp32 outputs are the torch ``DAT ... fp32 +sl``
    rows', their ``=full`` compares them with the rows without the shortlist, the JSON and the
    command say the shortlist, their memory probe imports no torch. An export of ``--onnx-dir``
    made with another shortlist, or a shortlisted one where none is asked for, stops the run."""
    import json

    from fadat.models.shortlist import build_shortlist

    bench = load_bench()
    models, src, ref = models_with_shortlist(tmp_path, PAIRS, top_k=1, frequent=0)
    onnx_dir = tmp_path / "onnx"
    onnx_dir.mkdir()
    for name, root in (("fp32", dat_onnx), ("int8", dat_onnx), ("fp32-sl", dat_onnx_shortlist)):
        (onnx_dir / name).symlink_to(root["dir"] / name, target_is_directory=True)
    (onnx_dir / "int8-sl").symlink_to(dat_onnx_shortlist["dir"] / "int8-sl")
    shortlist = dat_onnx_shortlist["shortlist"]
    out = tmp_path / "out.json"
    argv = ["--smoke", "--dat", str(models["dat"]), "--at", str(models["at"]), "--src", str(src)]
    argv += ["--ref", str(ref), "--precisions", "fp32", "--prune-thresholds"]
    argv += ["--onnx-dir", str(onnx_dir), "--shortlist", str(shortlist)]
    results = bench.main(
        [*argv, "--memory-batches", "1", "--only", "^(DAT|ORT) lookahead", "--json", str(out)]
    )
    assert list(results) == [
        "DAT lookahead fp32",
        "DAT lookahead fp32 +sl",
        "ORT lookahead fp32",
        "ORT lookahead fp32 +sl",
        "ORT lookahead int8",
        "ORT lookahead int8 +sl",
    ]
    outputs = {name: x["outputs"] for name, x in results.items()}
    assert outputs["ORT lookahead fp32 +sl"] == outputs["DAT lookahead fp32 +sl"]
    assert outputs["ORT lookahead fp32"] == outputs["DAT lookahead fp32"]
    saved = json.loads(out.read_text(encoding="utf-8"))
    for precision in ("fp32", "int8"):
        name = f"ORT lookahead {precision} +sl"
        x, row = results[name], saved[name]
        plain = outputs[f"ORT lookahead {precision}"]
        same = sum(a == b for a, b in zip(x["outputs"], plain, strict=True)) / len(plain)
        assert x["same_as_full"] == same and "cover" not in x
        assert (row["system"], row["precision"], row["shortlist"]) == (
            "onnxruntime",
            precision,
            True,
        )
        assert saved[f"ORT lookahead {precision}"]["shortlist"] is False
        assert f"--shortlist {shortlist} --output DIR" in row["command"]
        assert x["disk_mib"] > 0 and row["memory"]["torch"] is False
    other = build_shortlist([], 16, top_k=1, frequent=0).save(tmp_path / "other.safetensors")
    quick = [*argv[:-1], str(other), "--memory-batches", "0", "--only", "^ORT lookahead fp32"]
    with pytest.raises(SystemExit, match="not an export made with the shortlist"):
        bench.main(quick)
    (onnx_dir / "fp32").unlink()
    (onnx_dir / "fp32").symlink_to(dat_onnx_shortlist["dir"] / "fp32-sl")
    with pytest.raises(SystemExit, match="an export with a shortlist"):
        bench.main(argv[: argv.index("--shortlist")] + ["--memory-batches", "0"])
