"""The DAG beam search on the ONNX Runtime engine: the torch-free search
(fadat.engine.beam_np) against the torch wrapper and the plain reference on the same arrays, with
and without a KenLM LM; the export's top tokens (``top_lp``, ``top_tok``) against
``top_candidates`` of the model's log-probabilities; ONNX Runtime's TopK tie rule; the engine's
beam against the torch search on the arrays its graph produced (exact) and against the torch
model's beam; ``--top-k``, a version-1 export's refusal; the front ends (``fadat translate
--engine onnxruntime --strategy beam [--lm]``, the server's engine).

The exports are the test run's tiny random DAT (conftest.dat_onnx); the released model's are
compared in tests/test_engine_onnx.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_beam_compiled import assert_same, batch, random_options, reference, tricky_graph
from test_decoding_search import ARPA
from test_translate import (
    _assert_one_error_line,
    _one_thread,  # noqa: F401  (autouse: the tiny models on one thread)
    random_sentences,
    run_cli,
)

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.decoding.beam import beam_search_candidates, top_candidates
from fadat.engine import beam_np

# Tolerances of the tiny DAT's fp32 graph against torch (tests/test_engine_onnx.py's, where
# they are explained): log-probabilities within S_ATOL, tokens equal where the gap to the
# neighbouring ranks exceeds TOKEN_GAP.
S_ATOL = 1e-4
TOKEN_GAP = 4e-4


def as_numpy(*tensors):
    return [t.numpy() for t in tensors]


def same_hypotheses(got, want) -> None:
    """Outputs, paths, path tokens and scores identical (the same float64 operations)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.tokens, g.path, g.path_tokens, g.score) == (
            w.tokens,
            w.path,
            w.path_tokens,
            w.score,
        )


# ----------------------------------------------------------------------------------------------
# The numpy search against the torch wrapper and the reference


def top_arrays(tlp: torch.Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each vertex's ``n`` best tokens by the stable sort: ``(B, L, n)`` float64 and int64."""
    top_lp, top_tok = top_candidates(tlp, n)
    return top_lp.numpy(), top_tok.numpy()


@pytest.mark.parametrize("seed", range(3))
def test_numpy_search_equals_the_torch_wrapper_and_the_reference(seed):
    rng = np.random.default_rng(300 + seed)
    for _ in range(30):
        V = int(rng.integers(2, 7))
        graphs = [tricky_graph(rng, int(rng.integers(2, 13)), V) for _ in range(3)]
        tlp, ln, lens = batch(graphs)
        options = random_options(rng, int(tlp.shape[1]), V)
        top_lp, top_tok = top_arrays(tlp, options["top_cand_n"])
        got = beam_np.beam_search(top_lp, top_tok, ln.numpy(), lens.numpy(), **options)
        want = beam_search_candidates(
            torch.from_numpy(top_lp), torch.from_numpy(top_tok), ln, lens, **options
        )
        same_hypotheses(got, want)
        for (lp, ln_b), h in zip(graphs, got, strict=True):
            assert_same(h, reference(lp, ln_b, options))


def test_numpy_search_widens_float32_exactly():
    """float32 inputs (the ONNX Runtime graph's) are searched in float64: the same results as
    the torch wrapper given the same float32 tensors and as the search on their float64
    copies."""
    rng = np.random.default_rng(7)
    graphs = [tricky_graph(rng, int(rng.integers(2, 13)), 6) for _ in range(4)]
    tlp, ln, lens = batch(graphs)
    tlp = tlp + torch.from_numpy(rng.normal(0, 1e-3, tuple(tlp.shape)))  # not float32-exact
    top_lp, top_tok = top_arrays(tlp.float(), 4)
    lp32, ln32 = top_lp.astype(np.float32), ln.numpy().astype(np.float32)
    got = beam_np.beam_search(lp32, top_tok, ln32, lens.numpy(), top_cand_n=4)
    wrapper = beam_search_candidates(
        torch.from_numpy(lp32),
        torch.from_numpy(top_tok),
        torch.from_numpy(ln32),
        lens,
        top_cand_n=4,
    )
    wide = beam_np.beam_search(
        lp32.astype(np.float64), top_tok, ln32.astype(np.float64), lens.numpy(), top_cand_n=4
    )
    same_hypotheses(got, wrapper)
    same_hypotheses(got, wide)


@pytest.mark.parametrize("seed", range(2))
def test_numpy_search_with_kenlm_equals_the_wrapper_and_the_reference(tmp_path, seed):
    kenlm = pytest.importorskip("kenlm")
    path = tmp_path / "tiny.arpa"
    path.write_text(ARPA)
    words = ["w0", "w1", "w2", "w3", "w4", "w5"]  # w1, w4 and w5 are out of the LM's vocabulary
    lm = beam_np._LanguageModel(kenlm.Model(str(path)), words)
    rng = np.random.default_rng(400 + seed)
    for _ in range(20):
        V = int(rng.integers(2, 7))
        graphs = [tricky_graph(rng, int(rng.integers(2, 13)), V) for _ in range(3)]
        tlp, ln, lens = batch(graphs)
        options = random_options(rng, int(tlp.shape[1]), V)
        gamma = float(rng.choice([0.1, 1.0, 3.0]))
        kw = {"lm": lm.model, "lm_words": words[:V], "gamma": gamma}
        top_lp, top_tok = top_arrays(tlp, options["top_cand_n"])
        got = beam_np.beam_search(top_lp, top_tok, ln.numpy(), lens.numpy(), **options, **kw)
        want = beam_search_candidates(
            torch.from_numpy(top_lp), torch.from_numpy(top_tok), ln, lens, **options, **kw
        )
        same_hypotheses(got, want)
        for (lp, ln_b), h in zip(graphs, got, strict=True):
            assert_same(h, reference(lp, ln_b, options, lm, gamma))


def test_numpy_search_refuses_bad_inputs_as_the_wrapper():
    top_lp = np.zeros((1, 4, 3))
    top_tok = np.zeros((1, 4, 3), dtype=np.int64)
    ln, lens = np.zeros((1, 4, 4)), np.array([4])
    for call in (
        beam_np.beam_search,
        lambda *a, **k: beam_search_candidates(*(torch.from_numpy(x) for x in a), **k),
    ):
        with pytest.raises(ValueError, match="fewer than top_cand_n"):
            call(top_lp, top_tok, ln, lens, top_cand_n=4)
        with pytest.raises(ValueError, match=r"\(B, L, n\)"):
            call(top_lp, top_tok[..., :2], ln, lens, top_cand_n=2)
        with pytest.raises(ValueError, match="top_p"):
            call(top_lp, top_tok, ln, lens, top_cand_n=3, top_p=0.0)
        with pytest.raises(ValueError, match="beam_size"):
            call(top_lp, top_tok, ln, lens, top_cand_n=3, beam_size=0)
        with pytest.raises(ValueError, match="links must be"):
            call(top_lp, top_tok, ln[:, :3], lens, top_cand_n=3)
        with pytest.raises(ValueError, match="graph lengths"):
            call(top_lp, top_tok, ln, np.array([5]), top_cand_n=3)
        with pytest.raises(ValueError, match="lm_words"):
            call(top_lp, top_tok, ln, lens, top_cand_n=3, lm="x.arpa")


def test_lm_words_is_one_rule(models):
    from fadat.data.spm import load_sentencepiece
    from fadat.translation.language_model import SPECIAL_WORD, lm_words

    sp = load_sentencepiece(models["spm"])
    words = beam_np.lm_words(sp, (BOS_ID, PAD_ID, EOS_ID, UNK_ID))
    assert words == lm_words(sp) and SPECIAL_WORD == beam_np.SPECIAL_WORD == "<unk>"
    assert words[:4] == ["<unk>"] * 4 and words[4] == sp.id_to_piece(4)


# ----------------------------------------------------------------------------------------------
# The export's top tokens, and ONNX Runtime's TopK


def test_onnxruntime_topk_puts_the_lower_index_first_on_ties():
    """ONNX's TopK documents that of equal values the lower index comes first; ONNX Runtime's
    CPU kernel does so (the export's ``top_tok`` and ``tok`` rely on it): on values drawn from
    three levels and −inf, for k small and large against V, one and two threads, with the
    graph optimisations on (as the engine runs) and off."""
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    for V, k in ((7, 1), (7, 7), (40, 5), (4000, 5), (4000, 64)):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, V])
        v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [None, None, k])
        i = helper.make_tensor_value_info("i", TensorProto.INT64, [None, None, k])
        node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=1, sorted=1)
        kk = numpy_helper.from_array(np.array([k], dtype=np.int64), "k")
        graph = helper.make_graph([node], "g", [x], [v, i], initializer=[kk])
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        for threads, level in ((1, "ORT_ENABLE_ALL"), (2, "ORT_DISABLE_ALL")):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
            session = ort.InferenceSession(proto.SerializeToString(), options)
            for _ in range(5):
                a = rng.integers(-2, 1, size=(3, 20, V)).astype(np.float32)
                a[rng.random(a.shape) < 0.1] = -np.inf
                values, idx = session.run(None, {"x": a})
                want = np.argsort(-a, axis=-1, kind="stable")[..., :k]
                np.testing.assert_array_equal(idx, want)
                np.testing.assert_array_equal(values, np.take_along_axis(a, want, axis=-1))


def tiny_sources(model, seed: int, sizes=((1, 5), (3, 7), (5, 8))):
    """Random padded batches ``(B, S)`` for the tiny DAT (at most 8 source positions)."""
    from test_engine_onnx import random_source

    return [
        random_source(b, s, model.config.vocab_size, seed + k) for k, (b, s) in enumerate(sizes)
    ]


def close_ranks(values: np.ndarray, k: int) -> np.ndarray:
    """``(…, k)`` True where rank ``j`` of the ``k + 1`` sorted ``values`` is within TOKEN_GAP
    of rank ``j − 1`` or ``j + 1`` (where the two engines may order tokens differently)."""
    gaps = values[..., :-1] - values[..., 1:]  # (…, k)
    near = gaps <= TOKEN_GAP
    before = np.concatenate([np.zeros_like(near[..., :1]), near[..., : k - 1]], axis=-1)
    return near[..., :k] | before


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_export_top_tokens_equal_top_candidates(dat_onnx, precision):
    """``top_lp``/``top_tok`` of the export against ``top_candidates`` of the torch model's
    log-probabilities: fp32 within the tolerances, tokens equal away from near-ties; int8 runs,
    its columns ordered (descending, ties by the lower id). ``s``/``tok`` are the first column,
    padding vertices 0 and ``<pad>``."""
    from fadat.engine.runtime import OnnxDAT
    from fadat.models.directory import load_pretrained

    model = load_pretrained(dat_onnx["dat"]).eval()
    engine = OnnxDAT(dat_onnx["dir"] / precision)
    k = engine.top_k
    assert k == 5 and engine.format_version == 2
    for source in tiny_sources(model, seed=20):
        top_lp, top_tok, links, lengths = engine.run_top_k(source.numpy())
        s, tok, links1, lengths1 = engine.run(source.numpy())
        np.testing.assert_array_equal(links, links1)
        np.testing.assert_array_equal(lengths, lengths1)
        assert top_lp.dtype == np.float32 and top_tok.dtype == np.int64
        B, L = s.shape
        assert top_lp.shape == top_tok.shape == (B, L, k)
        np.testing.assert_array_equal(top_lp[..., 0], s)
        np.testing.assert_array_equal(top_tok[..., 0], tok)
        real = np.arange(L)[None, :] < lengths[:, None]  # (B, L)
        assert (top_lp[~real] == 0).all() and (top_tok[~real] == PAD_ID).all()
        assert (np.diff(top_lp[real], axis=-1) <= 0).all()
        tie = np.diff(top_lp[real], axis=-1) == 0
        assert (np.diff(top_tok[real], axis=-1)[tie] > 0).all()
        if precision != "fp32":
            continue
        with torch.inference_mode():
            logp, _ = model(source, torch.from_numpy(lengths))  # (B, L, V)
        want_lp, want_tok = top_candidates(logp, k)
        np.testing.assert_allclose(top_lp[real], want_lp.numpy()[real], rtol=0, atol=S_ATOL)
        values = logp.topk(k + 1, dim=-1).values.numpy()  # (B, L, k + 1)
        clear = real[..., None] & ~close_ranks(values, k)  # (B, L, k)
        assert clear[real].mean() > 0.9  # most ranks are clear of their neighbours
        np.testing.assert_array_equal(top_tok[clear], want_tok.numpy()[clear])


@pytest.fixture(scope="module")
def arpa(models, tmp_path_factory) -> Path:
    """The tiny LM of tests/test_lm_cli.py over the tiny models' pieces (it prefers ``▁ab``)."""
    from test_lm_cli import FAVOURITE, pieces, write_arpa

    words = [w for w in pieces(models["spm"]) if not w.startswith("<")]
    return write_arpa(tmp_path_factory.mktemp("lm") / "pieces.arpa", words, FAVOURITE)


def test_engine_reads_its_lm_words_once(dat_onnx, arpa, monkeypatch):
    """The engine's LM words are the verbs' rule on its sentencepiece model, read on the first
    search with an LM and kept (a tuple: a caller cannot change them), not read again for every
    batch."""
    pytest.importorskip("kenlm")
    import kenlm

    from fadat.data.spm import load_sentencepiece
    from fadat.engine.runtime import OnnxDAT
    from fadat.translation.language_model import lm_words

    engine = OnnxDAT(dat_onnx["dir"] / "int8")
    reads = []
    real = beam_np.lm_words
    monkeypatch.setattr(beam_np, "lm_words", lambda *a: reads.append(a) or real(*a))
    options = {"beam_size": 4, "lm": kenlm.Model(str(arpa)), "gamma": 1.0}
    first = engine.translate_ids([[5, 6, 7, EOS_ID]], "beam", **options)
    again = engine.translate_ids([[5, 6, 7, EOS_ID]], "beam", **options)
    engine.translate_ids([[8, 9, EOS_ID], [5, EOS_ID]], "beam", **options)
    assert len(reads) == 1 and first == again
    words = engine.lm_words()
    assert isinstance(words, tuple) and engine.lm_words() is words
    assert list(words) == lm_words(load_sentencepiece(dat_onnx["dir"] / "int8" / "spm.model"))


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("with_lm", [False, True])
def test_engine_beam_equals_the_search_on_its_graphs_arrays(dat_onnx, arpa, precision, with_lm):
    """The engine's beam (``translate_ids(..., "beam")``) is the torch beam search
    (``beam_search_candidates``) on the arrays its graph produced, to the last bit: the same
    outputs, paths and scores, with the options and the LM passed through."""
    from fadat.engine.runtime import OnnxDAT
    from fadat.models.directory import load_pretrained

    options = {"beam_size": 20, "max_beam_per_length": 4, "top_cand_n": 4, "alpha": 0.9}
    if with_lm:
        pytest.importorskip("kenlm")
        import kenlm

        options |= {"lm": kenlm.Model(str(arpa)), "gamma": 2.0}
    model = load_pretrained(dat_onnx["dat"]).eval()
    engine = OnnxDAT(dat_onnx["dir"] / precision)
    words = engine.lm_words()
    for source in tiny_sources(model, seed=40):
        ids = [row[row != PAD_ID].tolist() for row in source]
        got = engine.translate_ids(ids, "beam", **options)
        top_lp, top_tok, links, lengths = engine.run_top_k(source.numpy())
        extra = {"lm_words": words} if with_lm else {}
        want = beam_search_candidates(
            *(torch.from_numpy(x) for x in (top_lp, top_tok, links, lengths)), **options, **extra
        )
        same_hypotheses(got, want)


def test_engine_beam_equals_the_torch_models_beam(dat_onnx, arpa, tmp_path):
    """fp32: the engine's translations with the beam search, without and with the LM, are the
    torch engine's (the model's full log-probabilities, ``top_candidates``, the same search)."""
    import fadat
    from fadat.data.spm import load_sentencepiece
    from fadat.translation.language_model import language_model_options

    lines = random_sentences(12, seed=51)
    torch_side = fadat.Translator.from_pretrained(dat_onnx["dat"], engine="torch")
    onnx_side = fadat.Translator.from_pretrained(dat_onnx["dir"] / "fp32")
    assert onnx_side.model.engine.top_k == 5
    runs = [{}, {"beam_size": 5, "top_cand_n": 3, "top_p": 1.0}]
    if importlib.util.find_spec("kenlm") is not None:  # without kenlm: the runs without an LM
        sp = load_sentencepiece(dat_onnx["dir"] / "fp32" / "spm.model")
        with_lm = {"gamma": 2.0, **language_model_options(str(arpa), torch_side.model, sp)}
        runs.append(with_lm)
    outputs = []
    for options in runs:
        want = torch_side.translate(lines, strategy="beam", **options)
        got = onnx_side.translate(lines, strategy="beam", **options)
        assert got == want
        outputs.append(got)
    if len(runs) == 3:
        assert outputs[0] != outputs[-1]  # the LM changed something: the comparison means something


# ----------------------------------------------------------------------------------------------
# --top-k, format versions


def version_1_copy(export: Path, out: Path) -> Path:
    """An export of format version 1 made from a version-2 one: the graph without the
    ``top_lp``/``top_tok`` outputs (ONNX Runtime then leaves the rest as it was) and the
    metadata of version 1."""
    import onnx

    shutil.copytree(export, out)
    proto = onnx.load(str(out / "dat.onnx"))
    kept = [o for o in proto.graph.output if o.name in ("s", "tok", "links")]
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
    onnx.save_model(proto, str(out / "dat.onnx"))
    meta = json.loads((out / "metadata.json").read_text(encoding="utf-8"))
    meta["format_version"] = 1
    del meta["top_k"]
    meta["strategies"] = ["greedy", "lookahead", "viterbi", "joint-viterbi"]
    (out / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    return out


def test_version_1_export_refuses_beam_and_still_translates(
    dat_onnx, tmp_path, capsys, monkeypatch
):
    from fadat.engine.runtime import EngineDirectoryError, OnnxDAT
    from fadat.serve.engine import Engine

    old = version_1_copy(dat_onnx["dir"] / "fp32", tmp_path / "v1")
    engine, new = OnnxDAT(old), OnnxDAT(dat_onnx["dir"] / "fp32")
    assert (engine.format_version, engine.top_k) == (1, 0)
    assert "beam" not in engine.strategies and "beam" in new.strategies
    assert [o.name for o in engine.session.get_outputs()] == ["s", "tok", "links"]
    lines = random_sentences(6, seed=61)
    assert engine.translate(lines) == new.translate(lines)  # lookahead
    for call in (
        lambda: engine.translate(lines, "beam"),
        lambda: engine.translate_ids([[5, 6, 2]], "beam"),
        lambda: engine.run_top_k(np.array([[5, 6, 2]])),
    ):
        with pytest.raises(ValueError, match="export the model again"):
            call()
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["translate", "--model", str(old), "--input", str(src)]
    code, _, err = run_cli([*argv, "--strategy", "beam"], capsys, monkeypatch)
    _assert_one_error_line(code, err, "format-version-1", "export the model again")
    code, out, _ = run_cli(argv, capsys, monkeypatch)
    assert code == 0 and out.splitlines() == new.translate(lines)
    server = Engine.from_directory(old)
    assert "beam" not in server.strategies and "lookahead" in server.strategies
    # a metadata that claims version 2 for a graph without the top tokens; a newer version
    meta = json.loads((old / "metadata.json").read_text(encoding="utf-8"))
    (old / "metadata.json").write_text(json.dumps(meta | {"format_version": 2, "top_k": 5}))
    with pytest.raises(EngineDirectoryError, match="without the outputs top_lp and top_tok"):
        OnnxDAT(old)
    (old / "metadata.json").write_text(json.dumps(meta | {"format_version": 3}))
    with pytest.raises(EngineDirectoryError, match=r"newer than this fadat reads \(2\)"):
        OnnxDAT(old)


def test_top_k_option_of_the_export(dat_onnx, tmp_path, capsys, monkeypatch):
    """``fadat export --format onnx --top-k 3``: 3 tokens per vertex in the graph and the
    metadata; the beam search takes ``top_cand_n`` up to 3 (the same search on the graph's
    arrays) and refuses more with the way out; ``--top-k`` outside ``[1, V]`` is refused."""
    from fadat.engine.runtime import OnnxDAT
    from fadat.models.directory import load_pretrained

    out = tmp_path / "k3"
    argv = ["export", "--format", "onnx", "--model", str(dat_onnx["dat"])]
    code, printed, _ = run_cli([*argv, "--output", str(out), "--top-k", "3"], capsys, monkeypatch)
    assert code == 0 and "top 3 tokens per vertex" in printed
    meta = json.loads((out / "metadata.json").read_text(encoding="utf-8"))
    assert (meta["format_version"], meta["top_k"]) == (2, 3) and "beam" in meta["strategies"]
    engine = OnnxDAT(out)
    model = load_pretrained(dat_onnx["dat"]).eval()
    (source,) = tiny_sources(model, seed=70, sizes=((4, 8),))
    top_lp, top_tok, links, lengths = engine.run_top_k(source.numpy())
    assert top_lp.shape[-1] == 3
    wide_lp, wide_tok, _, _ = OnnxDAT(dat_onnx["dir"] / "fp32").run_top_k(source.numpy())
    np.testing.assert_array_equal(top_tok, wide_tok[..., :3])
    np.testing.assert_allclose(top_lp, wide_lp[..., :3], rtol=0, atol=1e-6)
    ids = [row[row != PAD_ID].tolist() for row in source]
    got = engine.translate_ids(ids, "beam", top_cand_n=3)
    want = beam_search_candidates(
        *(torch.from_numpy(x) for x in (top_lp, top_tok, links, lengths)), top_cand_n=3
    )
    same_hypotheses(got, want)
    with pytest.raises(ValueError, match="export again with --top-k 4"):
        engine.translate_ids(ids, "beam", top_cand_n=4)
    src = tmp_path / "in.txt"
    src.write_text("ab cd\n", encoding="utf-8")
    translate = ["translate", "--model", str(out), "--input", str(src), "--strategy", "beam"]
    code, _, err = run_cli([*translate, "--top-cand-n", "4"], capsys, monkeypatch)
    _assert_one_error_line(code, err, "this export gives 3 tokens per vertex", "--top-k 4")
    code, _, err = run_cli(
        [*argv, "--output", str(tmp_path / "x"), "--top-k", "17"], capsys, monkeypatch
    )
    _assert_one_error_line(code, err, "--top-k must be an integer in [1, 16]")
    assert not (tmp_path / "x").exists()
    code, _, err = run_cli(
        [*argv, "--output", str(tmp_path / "x"), "--top-k", "0"], capsys, monkeypatch
    )
    assert code == 2 and "--top-k" in err


# ----------------------------------------------------------------------------------------------
# The front ends


def test_cli_translate_beam_on_onnxruntime(dat_onnx, arpa, tmp_path, capsys, monkeypatch):
    """``fadat translate --engine onnxruntime --strategy beam`` with the beam options, ``--lm``
    and ``--gamma``: the engine's translations of the same options, and the torch engine's
    translations of the same flags (fp32)."""
    pytest.importorskip("kenlm")
    from fadat.engine.runtime import OnnxDAT

    lines = random_sentences(10, seed=81)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flags = ["--strategy", "beam", "--beam-size", "20", "--top-cand-n", "4"]
    flags += ["--length-penalty", "1.0"]  # the beam search's α
    flags += ["--lm", str(arpa), "--gamma", "0.5", "--input", str(src)]
    outs = {}
    for engine, model in (("onnxruntime", dat_onnx["dir"] / "fp32"), ("torch", dat_onnx["dat"])):
        argv = ["translate", "--engine", engine, "--model", str(model), *flags]
        code, out, err = run_cli(argv, capsys, monkeypatch)
        assert code == 0, err
        outs[engine] = out.splitlines()
    assert outs["onnxruntime"] == outs["torch"]
    engine = OnnxDAT(dat_onnx["dir"] / "fp32")
    options = {"beam_size": 20, "top_cand_n": 4, "alpha": 1.0, "gamma": 0.5}
    assert outs["onnxruntime"] == engine.translate(lines, "beam", lm=arpa, **options)
    # the options the engine still does not take keep their messages
    base = ["translate", "--engine", "onnxruntime", "--model", str(dat_onnx["dir"] / "fp32")]
    base += ["--input", str(src)]
    code, _, err = run_cli([*base, "--strategy", "beam", "--nbest", "2"], capsys, monkeypatch)
    _assert_one_error_line(code, err, "one hypothesis")
    code, _, err = run_cli([*base, "--strategy", "sample"], capsys, monkeypatch)
    _assert_one_error_line(code, err, "not available", "choose one of")
    code, _, err = run_cli(
        [*base, "--strategy", "lookahead", "--lm", str(arpa)], capsys, monkeypatch
    )
    _assert_one_error_line(code, err, "--lm", "beam")


def test_engine_opens_the_lm_as_the_verbs_do(dat_onnx, arpa, tmp_path, capfd):
    """``OnnxDAT.translate(lm=FILE)`` and the verbs open a language model with one opener: a
    missing file, a directory and a text that is no LM get the verbs' messages (naming the file)
    as ``LanguageModelError``, a ``ValueError``; an ARPA file opens without KenLM's progress
    bar; ``str``, ``bytes`` and ``Path`` name the same file."""
    pytest.importorskip("kenlm")
    from fadat.engine.runtime import OnnxDAT
    from fadat.errors import InputError
    from fadat.translation.language_model import open_language_model

    engine = OnnxDAT(dat_onnx["dir"] / "fp32")
    text = tmp_path / "text.arpa"
    text.write_text("ab cd ef\n", encoding="utf-8")
    cases = [
        (tmp_path / "missing.arpa", "not found"),
        (tmp_path, "is not a file"),
        (text, ':1: not an ARPA file: expected \\data\\, found "ab cd ef" (lm takes an ARPA'),
    ]
    for path, needle in cases:
        with pytest.raises(beam_np.LanguageModelError, match=re.escape(needle)) as raised:
            engine.translate(["ab"], "beam", lm=path)
        assert str(path) in str(raised.value)
        assert isinstance(raised.value, ValueError)
        with pytest.raises(InputError) as verb:
            open_language_model(path, cli=True)
        assert str(verb.value) == str(raised.value).replace("(lm", "(--lm")
    capfd.readouterr()
    models = [beam_np.open_model(p) for p in (str(arpa), os.fsencode(arpa), arpa)]
    assert capfd.readouterr().err == ""
    assert len({m.order for m in models}) == 1
    assert {os.fsdecode(m.path) for m in models} == {str(arpa)}


def test_serve_engine_beam_on_onnxruntime(dat_onnx, arpa):
    """The server's engine on an export: ``beam`` offered with its options, ``gamma`` with
    ``--lm``; its translations are the engine's."""
    pytest.importorskip("kenlm")
    from fadat.engine.runtime import OnnxDAT
    from fadat.errors import InputError
    from fadat.serve.engine import Engine

    lines = random_sentences(4, seed=91)
    engine = OnnxDAT(dat_onnx["dir"] / "fp32")
    plain = Engine.from_directory(dat_onnx["dir"] / "fp32")
    assert "beam_size" in plain.strategies["beam"] and "gamma" not in plain.strategies["beam"]
    results = plain.translate(lines, *plain.check("beam", {"beam_size": 8}))
    assert [r.text for r in results] == engine.translate(lines, "beam", beam_size=8)
    with_lm = Engine.from_directory(dat_onnx["dir"] / "fp32", lm=arpa)
    assert "gamma" in with_lm.strategies["beam"]
    results = with_lm.translate(lines, *with_lm.check("beam", {"gamma": 2.0}))
    assert [r.text for r in results] == engine.translate(lines, "beam", lm=arpa, gamma=2.0)
    assert all(r.confidence is None for r in results)
    with pytest.raises(InputError, match="top_cand_n = 6"):
        plain.check("beam", {"top_cand_n": 6})


def test_bench_lm_search_compares_the_lm_files(dat_onnx, arpa, tmp_path, capsys):
    """bench/lm_search.py on the tiny export: a row per system and, for a second LM file, the
    count of identical hypotheses (here the same ARPA file twice: all of them)."""
    spec = importlib.util.spec_from_file_location(
        "lm_search", Path(__file__).parents[1] / "bench" / "lm_search.py"
    )
    lm_search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm_search)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "test.src.txt").write_text("ab\nab cd ab\ncd\n", encoding="utf-8")
    copy = tmp_path / "copy.arpa"
    copy.write_bytes(arpa.read_bytes())
    argv = ["--export", str(dat_onnx["dir"] / "fp32"), "--data", str(tmp_path), "--ratio", "2"]
    argv += ["--repeats", "2", "--lm", str(arpa), str(copy)]
    assert lm_search.main(argv) == 0
    out = capsys.readouterr().out
    assert "3 sentences of" in out
    for name in ("no LM", str(arpa), str(copy)):  # a row each: median, min and max ms
        assert re.search(rf"^{re.escape(name)}\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M), name
    assert f"{copy} against {arpa}: the same tokens for 3 of 3" in out
    assert out.rstrip().endswith("identical hypotheses (scores to the last bit) for 3")
