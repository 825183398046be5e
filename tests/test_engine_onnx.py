"""The ONNX export of a DAT (fadat.translation.onnx_export) run by ONNX Runtime
(fadat.engine.runtime): graph outputs (the top-1 and each vertex's top tokens) against fadat's
within stated tolerances, fp32 translations equal to fadat's on the 50 committed test sentences
(the beam search included), int8's agreement reported, the engine choice of the front ends, and
the stand-alone example without torch. The beam search on the engine in detail:
tests/test_engine_beam.py.

Exporting the committed model takes about 30 s of one core (the ``torch.export``-based
exporter), so one fp32 export per module; the int8 export is quantized from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import fadat  # noqa: E402
from fadat import cli  # noqa: E402
from fadat.data.contract import EOS_ID, PAD_ID  # noqa: E402
from fadat.decoding.beam import top_candidates  # noqa: E402
from fadat.engine.runtime import OnnxDAT  # noqa: E402
from fadat.models.directory import load_pretrained  # noqa: E402
from fadat.models.inference import graph_top1  # noqa: E402
from fadat.translation.onnx_export import (  # noqa: E402
    FUSED_ATTENTION_OP,
    decompose_logsumexp,
    export_graph,
    export_onnx,
    fold_transposed_weights,
    fused_attention,
    quantize_export,
)

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "bible-en-es-fadat-cpu-small"
TEST_EN = ROOT / "tests" / "data" / "bible-en-es-test-50.en"
EXAMPLE = ROOT / "examples" / "onnx_translate.py"

# Tolerances of the fp32 graph against fadat's fp32 torch path (graph_top1). Both compute the
# same fp32 operations; only the kernels' summation order differs (ONNX Runtime's MLAS against
# torch's oneDNN/MKL matmuls, its fused LayerNorm and Softmax), about 1e-7 relative per
# operation, grown through 6 layers and the heads. Measured on this machine at sizes up to
# B = 8, S = 120 (L = 480): |Δs| ≤ 1e-5 and |Δlinks| ≤ 6e-5 (links span −40…0); the bounds
# leave a margin of 10×. Argmax tokens must agree wherever fadat's top-2 gap exceeds
# TOKEN_GAP (4× the s tolerance; below it a flip is a legitimate tie of the two engines).
S_ATOL = 1e-4
LINKS_ATOL = 6e-4
TOKEN_GAP = 4e-4
SIZES = [(1, 1), (1, 6), (3, 17), (8, 40), (2, 120)]


@pytest.fixture(scope="module")
def model():
    return load_pretrained(MODEL).float().eval()


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx")
    fp32 = export_onnx(MODEL, root / "fp32")
    return {"fp32": fp32, "int8": quantize_export(fp32, root / "int8")}


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return TEST_EN.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def torch_translator() -> fadat.Translator:
    return fadat.Translator.from_pretrained(MODEL)


@pytest.fixture(scope="module")
def onnx_translator(exports) -> fadat.Translator:
    """The fp32 export on ONNX Runtime: one session for the tests that only translate."""
    return fadat.Translator.from_pretrained(exports["fp32"], engine="onnxruntime")


@pytest.fixture(scope="module")
def torch_lookahead(torch_translator, sentences) -> list[str]:
    return torch_translator.translate(sentences)


def random_source(batch: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """``(B, S)`` random ids ``x </s>``, row 0 of length S, the others shorter, PAD-padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    source = torch.randint(4, vocab, (batch, length), generator=g)
    for b, n in enumerate(lengths.tolist()):
        source[b, n - 1] = EOS_ID
        source[b, n:] = PAD_ID
    return source


def compare_graph(model, engine, sizes, seed=0) -> dict[str, float]:
    """Largest |Δs|, |Δlinks| (finite entries) and the share of tokens that differ where
    fadat's top-2 gap exceeds TOKEN_GAP, over random batches of ``sizes``; −inf patterns of the
    links must be the same. The same for each vertex's top tokens (``top_lp``, ``top_tok``)
    against :func:`fadat.decoding.beam.top_candidates` of fadat's log-probabilities: the largest
    |Δ| and the share of ranks whose token differs where that rank is more than TOKEN_GAP from
    its neighbours; ``s``/``tok`` must be their first column."""
    worst = {"s": 0.0, "links": 0.0, "tok": 0.0, "top_lp": 0.0, "top_tok": 0.0}
    for k, (batch, length) in enumerate(sizes):
        source = random_source(batch, length, model.config.vocab_size, seed + k)
        top1, links, lengths = graph_top1(model, source)
        s, tok, got_links, got_lengths = engine.run(source.numpy())
        assert got_lengths.tolist() == lengths.tolist()
        assert s.shape == tuple(top1.s.shape) and got_links.shape == tuple(links.shape)
        want_links = links.numpy()
        finite = np.isfinite(want_links)
        assert (np.isfinite(got_links) == finite).all()
        real = np.arange(s.shape[1])[None, :] < got_lengths[:, None]
        worst["s"] = max(worst["s"], float(np.abs(s - top1.s.numpy())[real].max()))
        worst["links"] = max(
            worst["links"], float(np.abs(got_links[finite] - want_links[finite]).max())
        )
        with torch.inference_mode():  # fadat's top-2 gap of every vertex
            logp, _ = model(source, lengths)
        top2 = logp.topk(2, dim=-1).values.numpy()  # (B, L, 2)
        clear = real & (top2[..., 0] - top2[..., 1] > TOKEN_GAP)
        worst["tok"] = max(worst["tok"], float((tok != top1.tok.numpy())[clear].mean()))
        assert (tok[~real] == PAD_ID).all()
        top_lp, top_tok, _, _ = engine.run_top_k(source.numpy())  # (B, L, k) each
        k = top_lp.shape[-1]
        assert k == engine.top_k
        np.testing.assert_array_equal(top_lp[..., 0], s)
        np.testing.assert_array_equal(top_tok[..., 0], tok)
        want_lp, want_tok = top_candidates(logp, k)  # (B, L, k) float64, int64
        worst["top_lp"] = max(worst["top_lp"], float(np.abs(top_lp - want_lp.numpy())[real].max()))
        values = logp.topk(k + 1, dim=-1).values.numpy()  # (B, L, k + 1)
        near = values[..., :-1] - values[..., 1:] <= TOKEN_GAP  # (B, L, k): rank j ≈ j + 1
        after = np.concatenate([np.zeros_like(near[..., :1]), near[..., :-1]], axis=-1)
        clear_k = real[..., None] & ~near & ~after  # (B, L, k)
        differ = (top_tok != want_tok.numpy())[clear_k]
        worst["top_tok"] = max(worst["top_tok"], float(differ.mean()))
    return worst


def test_fp32_graph_outputs_equal_fadats_within_tolerance(model, exports):
    worst = compare_graph(model, OnnxDAT(exports["fp32"]), SIZES)
    print(f"fp32 graph vs torch: {worst}")
    assert worst["s"] <= S_ATOL and worst["links"] <= LINKS_ATOL and worst["tok"] == 0.0
    assert worst["top_lp"] <= S_ATOL and worst["top_tok"] == 0.0


def test_int8_graph_outputs_are_reported(model, exports):
    """int8 against fp32 torch: reported, with loose bounds that catch a broken quantization
    (a wrong scale or a quantized links head gives errors of whole nats)."""
    worst = compare_graph(model, OnnxDAT(exports["int8"]), SIZES[:3])
    print(f"int8 graph vs fp32 torch: {worst}")
    assert worst["links"] < 1.0 and worst["s"] < 1.0


def test_export_directory_metadata_and_dynamic_axes(model, exports):
    import onnx

    meta = json.loads((exports["fp32"] / "metadata.json").read_text(encoding="utf-8"))
    assert meta["upsample_ratio"] == model.config.decoding_upsample_ratio
    assert meta["special_ids"] == {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
    assert meta["precision"] == "fp32" and meta["versions"]["fadat"] == fadat.__version__
    assert (exports["fp32"] / "spm.model").read_bytes() == (MODEL / "spm.model").read_bytes()
    proto = onnx.load(str(exports["fp32"] / "dat.onnx"))
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [meta["opset"]]

    def axes(values):
        return {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim] for v in values}

    assert axes(proto.graph.input) == {
        "source": ["batch", "source_length"],
        "decoder_tokens": ["batch", "graph_size"],
    }
    assert axes(proto.graph.output) == {
        "s": ["batch", "graph_size"],
        "tok": ["batch", "graph_size"],
        "links": ["batch", "graph_size", "graph_size"],
        "top_lp": ["batch", "graph_size", ""],
        "top_tok": ["batch", "graph_size", ""],
    }
    top = {v.name: v.type.tensor_type for v in proto.graph.output if v.name.startswith("top_")}
    assert [top[n].shape.dim[2].dim_value for n in ("top_lp", "top_tok")] == [5, 5]
    assert (top["top_lp"].elem_type, top["top_tok"].elem_type) == (
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.INT64,
    )
    assert (meta["format_version"], meta["top_k"]) == (2, 5)
    assert meta["strategies"] == ["greedy", "lookahead", "viterbi", "joint-viterbi", "beam"]
    assert ("", "TopK") in {(n.domain, n.op_type) for n in proto.graph.node}
    assert meta["attention"] == FUSED_ATTENTION_OP
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    layers = model.config.encoder_layers + 2 * model.config.decoder_layers
    assert ops.count(("com.microsoft", "MultiHeadAttention")) == layers
    assert ("", "Softmax") not in ops  # the links head's normalisation is a LogSoftmax
    int8 = json.loads((exports["int8"] / "metadata.json").read_text(encoding="utf-8"))
    assert int8["precision"] == "int8" and "quantize_dynamic" in int8["quantization"]
    assert "ReduceLogSumExp" not in {n.op_type for n in proto.graph.node}  # rewritten
    int8_graph = onnx.load(str(exports["int8"] / "dat.onnx")).graph
    ops = {n.op_type for n in int8_graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops
    # Every fp32 MatMul left with a weight (an initializer, or a Transpose of one) is the links
    # head's: the token head's shared weight was folded and quantized.
    inits = {i.name for i in int8_graph.initializer}
    producer = {o: n for n in int8_graph.node for o in n.output}

    def is_weight(name: str) -> bool:
        node = producer.get(name)
        return name in inits or (
            node is not None and node.op_type == "Transpose" and node.input[0] in inits
        )

    def scope(node) -> str:
        return " ".join(
            p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"
        )

    fp32_weighted = [n for n in int8_graph.node if n.op_type == "MatMul" and is_weight(n.input[1])]
    assert fp32_weighted and all("links_head" in scope(n) for n in fp32_weighted)


def _run_graph(proto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), options).run(None, feeds)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_logsumexp_rewrite_equals_the_reduction(keepdims):
    """decompose_logsumexp computes what ReduceLogSumExp does (float32, inputs spanning
    ±60 so that exp without the max shift would overflow): 2 ulps of values of size ≤ 60."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5, 5])
    y = helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [2, 1, 5, 5] if keepdims else [2, 5, 5]
    )
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    node = helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=keepdims)
    graph = helper.make_graph([node], "g", [x], [y], initializer=[axes])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": np.random.default_rng(0).uniform(-60, 60, (2, 4, 5, 5)).astype(np.float32)}
    (want,) = _run_graph(proto, feeds)
    assert decompose_logsumexp(proto) == 1
    onnx.checker.check_model(proto)
    assert "ReduceLogSumExp" not in {n.op_type for n in proto.graph.node}
    (got,) = _run_graph(proto, feeds)
    assert got.shape == want.shape
    ref = np.logaddexp.reduce(feeds["x"].astype(np.float64), axis=1, keepdims=bool(keepdims))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_fold_transposed_weights_keeps_the_product():
    """y = x @ Transpose(W) with W an initializer becomes y = x @ W' with W' = Wᵀ stored; the
    product is the same float32 computation (bit-equal), the Transpose is gone."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = rng.normal(size=(7, 3)).astype(np.float32)  # (V, d): an embedding
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7])
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "Wt"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[numpy_helper.from_array(w, "W")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": rng.normal(size=(2, 3)).astype(np.float32)}
    (want,) = _run_graph(proto, feeds)
    assert fold_transposed_weights(proto) == 1
    onnx.checker.check_model(proto)
    assert [n.op_type for n in proto.graph.node] == ["MatMul"]
    (got,) = _run_graph(proto, feeds)
    np.testing.assert_array_equal(got, want)


def test_fused_attention_computes_the_models_attention():
    """Inside fused_attention every attention block goes through key_masked_attention (the op
    the export turns into MultiHeadAttention): the model's outputs on padded batches are the
    same to float32 rounding (the same SDPA on differently laid out heads), and the blocks are
    restored afterwards."""
    from fadat.models.config import make_config
    from fadat.models.dat import DATModel
    from fadat.models.transformer import CrossAttention, SelfAttention

    torch.manual_seed(0)
    model = DATModel(make_config("tiny", 50)).eval()
    source = random_source(4, 9, 50, seed=3)
    lengths = model.graph_lengths(source.ne(PAD_ID).sum(1), True)
    with torch.inference_mode():
        want = model(source, lengths)
        with fused_attention(model):
            blocks = [m for m in model.modules() if isinstance(m, (SelfAttention, CrossAttention))]
            assert blocks and all("forward" in vars(m) for m in blocks)
            got = model(source, lengths)
        assert not any("forward" in vars(m) for m in model.modules())
        again = model(source, lengths)
    for w, g, a in zip(want, got, again, strict=True):
        finite = torch.isfinite(w)
        assert torch.equal(finite, torch.isfinite(g))
        torch.testing.assert_close(g[finite], w[finite], rtol=0, atol=1e-5)
        assert torch.equal(a, w)


def test_fused_and_standard_graphs_agree_on_padded_batches(dat_onnx, tmp_path):
    """The same tiny random DAT exported with ONNX Runtime's MultiHeadAttention and with the
    standard ops: equal outputs (fp32 rounding) on batches whose rows are padded, so the key
    padding mask reaches the fused op with the meaning it has in fadat (1 = attend). The fused
    graph is the test run's export of the random DAT (conftest.dat_onnx: ``export_graph`` with
    fused attention; an export takes ≈ 15 s of CPU time), so only the standard one is exported
    here. That DAT reads at most 8 source positions: batches of up to 8 tokens whose rows have
    random lengths (padded up to the first row's) test the mask as longer ones would."""
    import onnx
    import onnxruntime as ort

    model = load_pretrained(dat_onnx["dat"]).eval()
    vocab = model.config.vocab_size
    paths = {"fused": dat_onnx["dir"] / "fp32" / "dat.onnx", "standard": tmp_path / "std.onnx"}
    export_graph(model, paths["standard"], attention="standard")
    domains = {a: {n.domain for n in onnx.load(str(p)).graph.node} for a, p in paths.items()}
    assert "com.microsoft" in domains["fused"] and domains["standard"] <= {"", "ai.onnx"}
    sessions = {a: ort.InferenceSession(str(p)) for a, p in paths.items()}
    for k, (batch, length) in enumerate([(1, 5), (3, 7), (5, 8)]):
        source = random_source(batch, length, vocab, seed=10 + k)
        lengths = model.graph_lengths(source.ne(PAD_ID).sum(1), True)
        feeds = {
            "source": source.numpy(),
            "decoder_tokens": model.decoder_input_tokens(lengths).numpy(),
        }
        fused, standard = (sessions[a].run(None, feeds) for a in ("fused", "standard"))
        with torch.inference_mode():
            top1, _, _ = graph_top1(model, source)
        for got, want in zip(fused, standard, strict=True):
            finite = np.isfinite(want)
            assert (np.isfinite(got) == finite).all()
            np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=1e-5)
        # ONNX Runtime against torch: the module's S_ATOL, as for the released model. Measured on
        # this DAT's s: 4.6e-6 on an AVX2 Zen 3, 1.2e-5 with torch's kernels without AVX2
        # (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE: another CPU's rounding); the two
        # ONNX Runtime graphs above run the same MLAS kernels and agreed exactly on both.
        np.testing.assert_allclose(fused[0], top1.s.numpy(), rtol=0, atol=S_ATOL)


def test_export_attention_choice_is_checked(tmp_path):
    with pytest.raises(ValueError, match="attention must be one of"):
        export_graph(None, tmp_path / "x.onnx", attention="flash")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("strategy", "options"),
    [
        ("lookahead", {}),
        ("greedy", {}),
        ("joint-viterbi", {}),
        ("viterbi", {"length_penalty": 1.2}),
        ("beam", {}),
        ("beam", {"beam_size": 20, "top_cand_n": 3, "alpha": 1.0}),
    ],
)
def test_fp32_translations_equal_fadats(
    onnx_translator, torch_translator, sentences, torch_lookahead, strategy, options
):
    got = onnx_translator.translate(sentences, strategy=strategy, **options)
    if strategy == "lookahead" and not options:
        want = torch_lookahead
    else:
        want = torch_translator.translate(sentences, strategy=strategy, **options)
    assert got == want


def test_int8_agreement_is_reported(exports, sentences, torch_lookahead, record_property):
    got = fadat.Translator.from_pretrained(exports["int8"], engine="onnxruntime").translate(
        sentences
    )
    rate = sum(a == b for a, b in zip(got, torch_lookahead, strict=True)) / len(sentences)
    record_property("int8_agreement", rate)
    print(f"int8 ONNX Runtime lookahead: {rate:.0%} of {len(sentences)} sentences as fp32 torch")
    assert all(got)  # not asserted equal: int8 changes some outputs


def test_cli_translate_and_export_choose_the_engine(exports, tmp_path, capsys, sentences):
    src = tmp_path / "in.en"
    src.write_text("\n".join(sentences[:8]) + "\n", encoding="utf-8")
    outs = {}
    for engine, model in (("torch", MODEL), ("onnxruntime", exports["fp32"])):
        out = tmp_path / f"{engine}.es"
        argv = ["translate", "--engine", engine, "--model", str(model)]
        assert cli.main([*argv, "--input", str(src), "--output", str(out)]) == 0
        outs[engine] = out.read_text(encoding="utf-8")
    assert outs["onnxruntime"] == outs["torch"]
    # No --engine (auto): the engine of the directory given, an export's or a model's.
    for name, model in (("auto-onnx", exports["fp32"]), ("auto-torch", MODEL)):
        out = tmp_path / f"{name}.es"
        argv = ["translate", "--model", str(model), "--input", str(src), "--output", str(out)]
        assert cli.main(argv) == 0
        assert out.read_text(encoding="utf-8") == outs["torch"]
    from fadat.translation.engines import OnnxRuntimeModel

    translator = fadat.Translator.from_pretrained(exports["int8"])
    assert isinstance(translator.model, OnnxRuntimeModel)
    assert translator.model.engine.precision == "int8"

    def fails(argv) -> str:
        assert cli.main(argv) == 2
        return capsys.readouterr().err

    base = ["translate", "--input", str(src), "--output", str(tmp_path / "x")]
    onnx_run = [*base, "--engine", "onnxruntime", "--model", str(exports["fp32"])]
    assert "not available" in fails([*onnx_run, "--strategy", "sample"])
    torch_on_export = [*base, "--engine", "torch", "--model", str(exports["fp32"])]
    assert "--engine onnxruntime" in fails(torch_on_export)
    assert "int8" in fails([*onnx_run, "--precision", "int8"])
    assert "torch engine" in fails([*onnx_run, "--prune-threshold", "0.1"])


def test_export_refuses_other_architectures_and_existing_outputs(models, exports, tmp_path, capsys):
    argv = ["export", "--format", "onnx", "--output", str(tmp_path / "o")]
    assert cli.main([*argv, "--model", str(models["at"])]) == 2
    err = capsys.readouterr().err
    assert "'at' model" in err and "DAT" in err and not (tmp_path / "o").exists()
    # the engine refuses an AT before it starts exporting it (one error line, no export notice)
    src = tmp_path / "in.en"
    src.write_text("ab cd\n", encoding="utf-8")
    run = [
        "translate",
        "--engine",
        "onnxruntime",
        "--model",
        str(models["at"]),
        "--input",
        str(src),
    ]
    assert cli.main([*run, "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fadat: error: "), err
    assert str(models["at"]) in err and "DAT models only" in err and "--engine torch" in err
    assert not (tmp_path / "x").exists()
    again = ["export", "--format", "onnx", "--model", str(MODEL), "--output", str(exports["fp32"])]
    assert cli.main(again) == 2 and "--force" in capsys.readouterr().err
    assert cli.main([*argv, "--model", str(MODEL), "--precision", "bf16"]) == 2
    assert "invalid choice: 'bf16'" in capsys.readouterr().err


def test_serve_engine_on_onnxruntime(exports, sentences, torch_lookahead):
    from fadat.serve.engine import Engine

    engine = Engine.from_directory(exports["fp32"])  # engine "auto": the export's
    assert not engine.has_graph and "sample" not in engine.strategies
    assert "beam" in engine.strategies and "gamma" not in engine.strategies["beam"]  # no --lm
    results = engine.translate(sentences[:4], "lookahead", {})
    assert [r.text for r in results] == torch_lookahead[:4]
    assert all(r.confidence is None and r.log_prob is None for r in results)


BLOCK_TORCH = (
    "import runpy, sys\n"
    "class _NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ImportError('torch is blocked in this test')\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "assert 'torch' not in sys.modules\n"
)


def test_standalone_example_runs_without_torch(exports, sentences, torch_lookahead):
    text = "\n".join(sentences[:10]) + "\n"
    for precision in ("fp32", "int8"):
        out = subprocess.run(
            [sys.executable, "-c", BLOCK_TORCH, str(EXAMPLE), str(exports[precision])],
            input=text,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert len(lines) == 10
        if precision == "fp32":
            assert lines == torch_lookahead[:10]


def test_onnx_model_checks_options_from_the_records_without_decoding():
    """The engine's option check is the strategy record's (no trial decode), less what the
    engine lacks: n-gram bans, several hypotheses, and the beam search on an export that cannot
    feed it (version 1, or ``top_cand_n`` above its ``top_k``, ``min(top_cand_n, V)`` counted
    as the torch search takes it)."""
    from fadat.decoding.strategies import StrategyError
    from fadat.models.dat import DATModel
    from fadat.translation.engines import OnnxRuntimeModel

    def export(version: int, top_k: int, vocab: int = 100) -> OnnxDAT:
        """An OnnxDAT with what the checks read of an export (no session, no files)."""
        engine = object.__new__(OnnxDAT)
        engine.format_version, engine.top_k, engine.directory = version, top_k, Path("export")
        engine.metadata = {"vocab_size": vocab}
        return engine

    model = object.__new__(OnnxRuntimeModel)
    model.engine = export(2, 5)
    assert model.flag_aliases == DATModel.flag_aliases  # --length-penalty is the beam's α
    model.check_options("beam", {"beam_size": 4, "top_cand_n": 5})
    with pytest.raises(StrategyError, match="export again with --top-k 6"):
        model.check_options("beam", {"top_cand_n": 6})
    model.engine = export(2, 16, vocab=16)
    model.check_options("beam", {"top_cand_n": 100})  # min(100, V) = 16 tokens
    model.engine = export(1, 0)
    assert "beam" not in model.strategies() and "lookahead" in model.strategies()
    with pytest.raises(StrategyError, match="format-version-1 export .* export the model again"):
        model.check_options("beam", {})
    model.check_options("lookahead", {"beta": 0.5})
    with pytest.raises(StrategyError, match="one hypothesis"):
        model.check_options("lookahead", {}, nbest=2)
    with pytest.raises(StrategyError, match="does not take"):
        model.check_options("lookahead", {"no_repeated_ngram": 2})
    with pytest.raises(StrategyError, match="not available in the onnxruntime engine"):
        model.check_options("sample", {})
    with pytest.raises(StrategyError):
        model.check_options("joint-viterbi", {"max_length": 0})  # below the record's bound
