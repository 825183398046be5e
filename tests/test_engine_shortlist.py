"""The vocabulary shortlist on the ONNX Runtime engine (``fadat export --format onnx
--shortlist``): the shortlisted graph's outputs against the torch shortlist path
(fadat.models.inference.graph_top1 with a shortlist) and against the full head renormalised over
each sentence's candidates; the engine's candidates against ``Shortlist.candidates``; padding of
the candidate input; every strategy's hypotheses against torch's; the int8 export's token head;
the export's files and metadata; the front ends (``--shortlist`` with ``--engine onnxruntime``)
and the errors.

The exports are the test run's tiny random DAT with its shortlist (conftest.dat_onnx_shortlist;
the DAT of conftest.dat_onnx, whose export without a shortlist the unchanged contract is checked
on).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_engine_beam import tiny_sources
from test_translate import (
    _assert_one_error_line,
    _one_thread,  # noqa: F401  (autouse: the tiny models on one thread)
    random_sentences,
    run_cli,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from fadat.data.contract import PAD_ID  # noqa: E402
from fadat.decoding.beam import beam_search_candidates, top_candidates  # noqa: E402
from fadat.engine.runtime import EngineDirectoryError, OnnxDAT  # noqa: E402
from fadat.engine.shortlist import PAD_CANDIDATE, Shortlist  # noqa: E402
from fadat.errors import InputError  # noqa: E402
from fadat.models.directory import load_pretrained  # noqa: E402
from fadat.models.inference import graph_top1  # noqa: E402
from fadat.models.shortlist import SHORTLIST_NAME, load_shortlist  # noqa: E402

# The tolerances of the fp32 graph against torch (tests/test_engine_onnx.py, where they are
# measured and explained): log-probabilities within S_ATOL, links within LINKS_ATOL, tokens equal
# where the gap to the neighbouring ranks exceeds TOKEN_GAP.
S_ATOL = 1e-4
LINKS_ATOL = 6e-4
TOKEN_GAP = 4e-4
SIZES = ((1, 1), (1, 6), (3, 7), (5, 8), (8, 8))
TOP1 = ("greedy", "lookahead", "viterbi", "joint-viterbi")


@pytest.fixture(scope="module")
def model(dat_onnx_shortlist):
    return load_pretrained(dat_onnx_shortlist["dat"]).float().eval()


@pytest.fixture(scope="module")
def shortlist(dat_onnx_shortlist):
    return load_shortlist(dat_onnx_shortlist["shortlist"], 16)


@pytest.fixture(scope="module")
def engines(dat_onnx_shortlist) -> dict[str, OnnxDAT]:
    return {p: OnnxDAT(dat_onnx_shortlist["dir"] / f"{p}-sl") for p in ("fp32", "int8")}


def renormalised(model, source: torch.Tensor, shortlist) -> tuple[torch.Tensor, torch.Tensor]:
    """The full token head of ``source`` and the same renormalised over each sentence's
    candidates (−inf elsewhere): ``(B, L, V)`` fp32 each, from the torch model."""
    lengths = model.graph_lengths(source.ne(PAD_ID).sum(1), True)
    with torch.inference_mode():
        logp, _ = model(source, lengths)  # (B, L, V)
    inside = torch.zeros(logp.shape[0], logp.shape[-1], dtype=torch.bool)  # (B, V)
    for row in range(len(source)):
        inside[row, torch.from_numpy(shortlist.candidates(source[row]))] = True
    masked = logp.masked_fill(~inside[:, None, :], float("-inf"))
    return logp, masked - masked.logsumexp(-1, keepdim=True)


def clear_ranks(values: np.ndarray, k: int) -> np.ndarray:
    """``(…, k)`` True where rank ``j`` of the ``k + 1`` sorted ``values`` is more than
    TOKEN_GAP from its neighbours (where both engines must give the same token)."""
    near = values[..., :-1] - values[..., 1:] <= TOKEN_GAP  # (…, k): rank j ≈ j + 1
    after = np.concatenate([np.zeros_like(near[..., :1]), near[..., :-1]], axis=-1)
    return ~near & ~after


def test_engine_candidates_are_the_shortlists(engines, shortlist, model):
    """The engine feeds each sentence the torch engine's candidates (``Shortlist.candidates``,
    the one rule), sorted, padded with −1 to the batch's width, at least ``top_k`` columns."""
    engine = engines["fp32"]
    assert engine.shortlist is not None and engine.shortlist.same_table(shortlist)
    for source in tiny_sources(model, seed=3, sizes=SIZES):
        got = engine.candidates(source.numpy())  # (B, K)
        want = [shortlist.candidates(row) for row in source]
        assert got.shape == (len(source), max(engine.top_k, *(len(w) for w in want)))
        for row, w in zip(got, want, strict=True):
            assert row[: len(w)].tolist() == w.tolist()
            assert (row[len(w) :] == PAD_CANDIDATE).all()
    few = Shortlist(np.full((16, 1), -1), np.array([0, 1, 2, 3]), {})  # 4 < top_k = 5
    assert few.batch_candidates(np.array([[5, 2]]), 5).tolist() == [[0, 1, 2, 3, -1]]


@pytest.mark.parametrize("seed", [0, 1])
def test_fp32_outputs_equal_the_torch_shortlist_path(engines, shortlist, model, seed):
    """``s``/``tok`` against graph_top1 with the shortlist, ``top_lp``/``top_tok`` against
    ``top_candidates`` of the full head renormalised over the candidates, the links against
    torch's: within the fp32 export's tolerances, tokens equal away from near-ties. And the
    shortlist is used: no token outside the sentence's candidates, ``s`` above the full head's
    log-probability of the same token (renormalised), and at least the full head's ``s`` where
    its best token is a candidate."""
    engine = engines["fp32"]
    k = engine.top_k
    above = 0
    for source in tiny_sources(model, seed=10 * seed, sizes=SIZES):
        top1, links, lengths = graph_top1(model, source, shortlist=shortlist)
        s, tok, got_links, got_lengths = engine.run(source.numpy())
        top_lp, top_tok, _, _ = engine.run_top_k(source.numpy())
        assert got_lengths.tolist() == lengths.tolist()
        real = np.arange(s.shape[1])[None, :] < got_lengths[:, None]  # (B, L)
        np.testing.assert_allclose(s[real], top1.s.numpy()[real], rtol=0, atol=S_ATOL)
        finite = np.isfinite(links.numpy())
        assert (np.isfinite(got_links) == finite).all()
        assert np.abs(got_links[finite] - links.numpy()[finite]).max() <= LINKS_ATOL
        full, within = renormalised(model, source, shortlist)
        want_lp, want_tok = top_candidates(within, k)  # (B, L, k) float64, int64
        values = within.topk(k + 1, dim=-1).values.numpy()  # (B, L, k + 1)
        np.testing.assert_allclose(top_lp[real], want_lp.numpy()[real], rtol=0, atol=S_ATOL)
        clear = real[..., None] & clear_ranks(values, k)
        assert (top_tok == want_tok.numpy())[clear].all()
        assert (tok == top1.tok.numpy())[clear[..., 0]].all()
        np.testing.assert_array_equal(top_lp[..., 0], s)
        np.testing.assert_array_equal(top_tok[..., 0], tok)
        assert (tok[~real] == PAD_ID).all() and (s[~real] == 0).all()
        for row in range(len(source)):
            cand = set(shortlist.candidates(source[row]).tolist())
            rows = real[row]
            assert set(top_tok[row][rows].reshape(-1).tolist()) <= cand
            full_row = full[row].numpy()[rows]  # (L_b, V)
            own = np.take_along_axis(full_row, tok[row][rows][:, None], 1)[:, 0]
            assert (s[row][rows] >= own - S_ATOL).all()
            above += int((s[row][rows] > own + 1e-3).sum())
            best = full_row.argmax(-1)
            covered = np.isin(best, list(cand))
            assert (s[row][rows][covered] >= full_row.max(-1)[covered] - S_ATOL).all()
    assert above > 0  # renormalised: the shortlist's mass is below 1 on these vertices


def test_padding_the_candidates_changes_nothing(engines, model):
    """fp32: more −1 columns in the candidate input give the same outputs, bit for bit (the
    graph's session run directly); a sentence alone gives its outputs in a batch with a longer
    one (with wider candidates), within float rounding, and the same hypotheses."""
    engine = engines["fp32"]
    (source,) = tiny_sources(model, seed=20, sizes=((4, 8),))
    lengths = engine.graph_lengths((source != PAD_ID).sum(1).numpy())
    feeds = {"source": source.numpy(), "decoder_tokens": engine.decoder_tokens(lengths)}
    narrow = engine.candidates(source.numpy())
    wide = np.concatenate([narrow, np.full((len(source), 7), PAD_CANDIDATE)], axis=1)
    first = engine.session.run(None, {**feeds, "candidates": narrow})
    second = engine.session.run(None, {**feeds, "candidates": wide})
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    ids = [row[row != PAD_ID].tolist() for row in source]
    for row in range(1, len(ids)):
        alone = np.array([ids[row]])
        both = np.full((2, len(ids[0])), PAD_ID)
        both[0], both[1, : len(ids[row])] = ids[0], ids[row]
        assert engine.candidates(alone).shape[1] <= engine.candidates(both).shape[1]
        one, paired = engine.run_top_k(alone), engine.run_top_k(both)
        n = int(one[3][0])
        np.testing.assert_allclose(one[0][0, :n], paired[0][1, :n], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(one[1][0, :n], paired[1][1, :n])
        for strategy in (*TOP1, "beam"):
            got = engine.translate_ids([ids[row]], strategy)[0].tokens
            assert got == engine.translate_ids([ids[0], ids[row]], strategy)[1].tokens


def test_fewer_candidates_than_top_k(engines, model):
    """A sentence with fewer candidates than the export's ``top_k`` (a shortlist of the special
    tokens only): its last ``top_lp`` columns are −inf with ``<pad>``, the first ones the
    renormalised head over the specials; every strategy translates."""
    engine = engines["fp32"]
    specials = Shortlist(np.full((16, 2), -1), np.array([0, 1, 2, 3]), {})
    real, engine.shortlist = engine.shortlist, specials
    try:
        (source,) = tiny_sources(model, seed=30, sizes=((2, 6),))
        top_lp, top_tok, _, lengths = engine.run_top_k(source.numpy())
        full, within = renormalised(model, source, specials)
        for row, n in enumerate(lengths.tolist()):
            assert np.isneginf(top_lp[row, :n, 4]).all() and (top_tok[row, :n, 4] == PAD_ID).all()
            want = within[row, :n, :4].numpy()  # (L_b, 4) the specials
            got = np.take_along_axis(want, top_tok[row, :n, :4], 1)
            np.testing.assert_allclose(top_lp[row, :n, :4], got, rtol=0, atol=S_ATOL)
        ids = [row[row != PAD_ID].tolist() for row in source]
        for strategy in (*TOP1, "beam"):
            for h in engine.translate_ids(
                ids, strategy, **({"top_p": 1.0} if strategy == "beam" else {})
            ):
                assert set(h.tokens) <= {0, 1, 2, 3}
    finally:
        engine.shortlist = real


@pytest.fixture(scope="module")
def arpa(models, tmp_path_factory) -> Path:
    """The tiny LM of tests/test_lm_cli.py over the tiny models' pieces (it prefers ``▁ab``)."""
    from test_lm_cli import FAVOURITE, pieces, write_arpa

    words = [w for w in pieces(models["spm"]) if not w.startswith("<")]
    return write_arpa(tmp_path_factory.mktemp("lm") / "pieces.arpa", words, FAVOURITE)


def test_translations_equal_the_torch_shortlist_path(dat_onnx_shortlist, engines, arpa):
    """fp32: the engine's translations are the torch engine's with the same shortlist for the
    top-1 strategies; the beam search (which the torch engine runs on the full head only) gives
    the search's hypotheses on the torch model's head renormalised over the candidates, with and
    without an LM. Outputs hold candidates only, and the shortlist changed some of them."""
    import fadat
    from fadat.data.spm import encode_source, load_sentencepiece
    from fadat.translation.language_model import language_model_options

    lines = random_sentences(16, seed=41)
    torch_sl = fadat.Translator.from_pretrained(dat_onnx_shortlist["dat"], shortlist=True)
    torch_full = fadat.Translator.from_pretrained(dat_onnx_shortlist["dat"])
    onnx_sl = fadat.Translator.from_pretrained(dat_onnx_shortlist["dir"] / "fp32-sl")
    changed = 0
    for strategy in TOP1:
        want = torch_sl.translate(lines, strategy=strategy)
        assert onnx_sl.translate(lines, strategy=strategy) == want, strategy
        changed += sum(
            a != b
            for a, b in zip(want, torch_full.translate(lines, strategy=strategy), strict=True)
        )
    assert changed > 0  # the shortlist is used: without it some outputs are other
    model, engine = torch_sl.model, engines["fp32"]
    sp = load_sentencepiece(dat_onnx_shortlist["dat"] / "spm.model")
    sources = [encode_source(sp, line) for line in lines]
    source = torch.full((len(sources), max(map(len, sources))), PAD_ID)
    for row, ids in enumerate(sources):
        source[row, : len(ids)] = torch.tensor(ids)
    _, within = renormalised(model, source, engine.shortlist)
    top_lp, top_tok = top_candidates(within, engine.top_k)
    _, links, lengths = graph_top1(model, source)
    runs = [{}, {"beam_size": 5, "top_cand_n": 3, "top_p": 1.0}]
    if importlib.util.find_spec("kenlm") is not None:
        runs.append({"gamma": 2.0, **language_model_options(str(arpa), model, sp)})
    for options in runs:
        want = beam_search_candidates(top_lp, top_tok, links, lengths, **options)
        got = engine.translate_ids(
            sources, "beam", **{k: v for k, v in options.items() if k != "lm_words"}
        )
        assert [h.tokens for h in got] == [h.tokens for h in want], options.keys()
        for ids, h in zip(sources, got, strict=True):
            assert set(h.tokens) <= set(engine.shortlist.candidates(ids).tolist())


def full_head_int8_weight(weight: np.ndarray, tmp_path: Path) -> np.ndarray:
    """``weight`` ``(V, d)`` as ONNX Runtime's dynamic quantization stores the full token head's
    (the MatMul ``x @ Wᵀ`` of an fp32 export, per output channel, int8), dequantized in fp32:
    ``(V, d)``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weight.shape[1]])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, weight.shape[0]])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "head",
        [x],
        [y],
        [numpy_helper.from_array(weight.T.copy(), "W")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    quantize_dynamic(
        proto, str(tmp_path / "head.onnx"), weight_type=QuantType.QInt8, per_channel=True
    )
    stored = {
        i.name: numpy_helper.to_array(i)
        for i in onnx.load(str(tmp_path / "head.onnx")).graph.initializer
    }
    q, scale, zero = (stored[f"W_{n}"] for n in ("quantized", "scale", "zero_point"))
    return (scale[None, :] * (q.astype(np.float32) - zero[None, :].astype(np.float32))).T


def test_int8_export_multiplies_the_int8_rows_in_fp32(dat_onnx_shortlist, engines, model, tmp_path):
    """The int8 shortlisted graph: the encoder's and decoder's MatMuls quantized, the links head
    and the shortlisted head not; the head gathers its rows from a copy of the output projection
    rounded to int8 and back exactly as ONNX Runtime quantizes the full head's weight (per
    token, symmetric). Its ``s`` is near the fp32 export's (the int8 encoder and decoder move
    it: on this tiny random DAT by up to a nat) and its tokens are candidates; every strategy
    translates."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(dat_onnx_shortlist["dir"] / "int8-sl" / "dat.onnx")).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}

    def scope(node) -> str:
        names = [p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
        return " ".join(names)

    ops = {n.op_type for n in graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    head = [n for n in graph.node if "shortlist_head" in scope(n)]
    assert {n.op_type for n in head} >= {"Gather", "MatMul", "LogSoftmax", "TopK"}
    (gather,) = [n for n in head if n.op_type == "Gather" and n.input[0] in inits]
    rows = inits[gather.input[0]]  # (V, d)
    weight = model.output_weight.detach().numpy()
    assert gather.input[0].endswith("_int8_dequantized") and rows.shape == weight.shape
    np.testing.assert_array_equal(rows, full_head_int8_weight(weight, tmp_path))
    assert not np.array_equal(rows, weight)  # rounded
    for n in graph.node:
        if n.op_type == "MatMulInteger":
            assert "links_head" not in scope(n) and "shortlist_head" not in scope(n)
    meta = json.loads((dat_onnx_shortlist["dir"] / "int8-sl" / "metadata.json").read_text())
    assert meta["precision"] == "int8" and "shortlisted token head excluded" in meta["quantization"]
    int8, fp32 = engines["int8"], engines["fp32"]
    for source in tiny_sources(model, seed=50, sizes=((1, 6), (3, 8))):
        s8, tok8, links8, lengths = int8.run(source.numpy())
        s, _, links, _ = fp32.run(source.numpy())
        real = np.arange(s.shape[1])[None, :] < lengths[:, None]
        assert np.abs(s8 - s)[real].max() < 2.0  # a wrong scale would be whole nats off
        assert (np.isfinite(links8) == np.isfinite(links)).all()
        for row in range(len(source)):
            cand = set(int8.shortlist.candidates(source[row]).tolist())
            assert set(tok8[row][real[row]].tolist()) <= cand
    lines = random_sentences(6, seed=52)
    for strategy in (*TOP1, "beam"):
        assert len(int8.translate(lines, strategy)) == len(lines)


# ----------------------------------------------------------------------------------------------
# The export's files, the unchanged contract without a shortlist, errors


def test_export_files_and_metadata(dat_onnx_shortlist, dat_onnx):
    """A shortlisted export holds a byte copy of the shortlist file, names it in
    ``metadata.json`` (format version 2, the input, the contract, the settings) and has the
    third input ``candidates`` ``(batch, candidates)`` int64; the int8 export copies it too. An
    export without a shortlist keeps its two inputs and its metadata without ``shortlist``, and
    its engine feeds no candidates."""
    import onnx

    source = Path(dat_onnx_shortlist["shortlist"]).read_bytes()
    for precision in ("fp32", "int8"):
        out = dat_onnx_shortlist["dir"] / f"{precision}-sl"
        assert (out / SHORTLIST_NAME).read_bytes() == source
        meta = json.loads((out / "metadata.json").read_text(encoding="utf-8"))
        assert meta["format_version"] == 2 and meta["precision"] == precision
        sl = meta["shortlist"]
        assert (sl["file"], sl["input"]) == (SHORTLIST_NAME, "candidates")
        assert sl["settings"]["top_k"] == "2" and sl["settings"]["frequent"] == "1"
        assert sl["copied_from"] == str(Path(dat_onnx_shortlist["shortlist"]).resolve())
        assert "renormalised" in sl["contract"]
        graph = onnx.load(str(out / "dat.onnx")).graph
        inputs = {
            v.name: (
                [d.dim_param for d in v.type.tensor_type.shape.dim],
                v.type.tensor_type.elem_type,
            )
            for v in graph.input
        }
        assert inputs == {
            "source": (["batch", "source_length"], onnx.TensorProto.INT64),
            "decoder_tokens": (["batch", "graph_size"], onnx.TensorProto.INT64),
            "candidates": (["batch", "candidates"], onnx.TensorProto.INT64),
        }
        assert [o.name for o in graph.output] == ["s", "tok", "links", "top_lp", "top_tok"]
    plain = dat_onnx["dir"] / "fp32"
    meta = json.loads((plain / "metadata.json").read_text(encoding="utf-8"))
    assert "shortlist" not in meta and not (plain / SHORTLIST_NAME).exists()
    engine = OnnxDAT(plain)
    assert engine.shortlist is None
    assert [i.name for i in engine.session.get_inputs()] == ["source", "decoder_tokens"]
    with pytest.raises(ValueError, match="without a shortlist"):
        engine.candidates(np.array([[5, 2]]))


def test_export_and_engine_errors(dat_onnx_shortlist, dat_onnx, tmp_path, capsys, monkeypatch):
    """A shortlist for another vocabulary size, a missing one: refused by the export before
    anything is written (Python and command line). An export whose shortlist file is missing,
    unreadable or of another vocabulary, or whose graph and metadata disagree about the
    shortlist: refused by the engine, naming the directory."""
    from fadat.models.shortlist import build_shortlist
    from fadat.translation.export import export

    other = build_shortlist([], 20, top_k=1, frequent=0).save(tmp_path / "other.safetensors")
    dat = dat_onnx_shortlist["dat"]
    with pytest.raises(InputError, match="built for a vocabulary of 20, the model has 16"):
        export(dat, tmp_path / "x", format="onnx", shortlist=other)
    with pytest.raises(InputError, match="no shortlist"):
        export(dat, tmp_path / "x", format="onnx", shortlist=tmp_path / "missing.safetensors")
    argv = ["export", "--format", "onnx", "--model", str(dat), "--output", str(tmp_path / "x")]
    code, _, err = run_cli([*argv, "--shortlist", str(other)], capsys, monkeypatch)
    _assert_one_error_line(code, err, str(other), "vocabulary of 20")
    assert not (tmp_path / "x").exists()

    def broken(name: str, change) -> Path:
        out = shutil.copytree(dat_onnx_shortlist["dir"] / "fp32-sl", tmp_path / name)
        change(out)
        return out

    def retable(out: Path) -> None:
        shutil.copyfile(other, out / SHORTLIST_NAME)

    def garble(out: Path) -> None:
        (out / SHORTLIST_NAME).write_bytes(b"not a safetensors file")

    def unname(out: Path) -> None:
        meta = json.loads((out / "metadata.json").read_text(encoding="utf-8"))
        del meta["shortlist"]
        (out / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")

    for name, change, message in (
        (
            "missing",
            lambda out: (out / SHORTLIST_NAME).unlink(),
            "shortlist.safetensors is missing",
        ),
        ("garbled", garble, "its shortlist: .* unreadable shortlist"),
        ("other", retable, "its shortlist: .* vocabulary of 20, the model has 16"),
        ("unnamed", unname, "has the input 'candidates' but metadata.json has no shortlist"),
    ):
        with pytest.raises(EngineDirectoryError, match=message):
            OnnxDAT(broken(name, change))
    plain = shutil.copytree(dat_onnx["dir"] / "fp32", tmp_path / "plain")
    meta = json.loads((plain / "metadata.json").read_text(encoding="utf-8"))
    meta["shortlist"] = {"file": SHORTLIST_NAME}
    (plain / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    shutil.copyfile(dat_onnx_shortlist["shortlist"], plain / SHORTLIST_NAME)
    with pytest.raises(EngineDirectoryError, match="lacks the input 'candidates'"):
        OnnxDAT(plain)
    src = tmp_path / "in.txt"
    src.write_text("ab cd\n", encoding="utf-8")
    argv = ["translate", "--model", str(tmp_path / "missing"), "--input", str(src)]
    code, _, err = run_cli(argv, capsys, monkeypatch)
    _assert_one_error_line(code, err, str(tmp_path / "missing"), "shortlist.safetensors is missing")


# ----------------------------------------------------------------------------------------------
# The front ends


def test_cli_translate_and_shortlist_flag_on_the_engine(
    dat_onnx_shortlist, dat_onnx, tmp_path, capsys, monkeypatch
):
    """``fadat translate`` on a shortlisted export runs its shortlist with or without
    ``--shortlist`` (bare: the export's own; a file: the same table), as the torch engine's
    ``--shortlist`` does; another shortlist, ``--shortlist`` on an export without one and
    ``--prune-threshold`` are refused with one line."""
    from fadat.models.shortlist import build_shortlist

    lines = random_sentences(8, seed=71)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    export = dat_onnx_shortlist["dir"] / "fp32-sl"
    torch_run = ["translate", "--model", str(dat_onnx_shortlist["dat"]), "--input", str(src)]
    code, want, _ = run_cli([*torch_run, "--shortlist", "--engine", "torch"], capsys, monkeypatch)
    assert code == 0
    run = ["translate", "--model", str(export), "--input", str(src)]
    for extra in ([], ["--shortlist"], ["--shortlist", str(dat_onnx_shortlist["shortlist"])]):
        code, out, err = run_cli([*run, "--engine", "onnxruntime", *extra], capsys, monkeypatch)
        assert (code, out, err) == (0, want, ""), extra
    other = build_shortlist([], 16, top_k=1, frequent=0).save(tmp_path / "other.safetensors")
    code, _, err = run_cli([*run, "--shortlist", str(other)], capsys, monkeypatch)
    _assert_one_error_line(code, err, str(other), "not the shortlist of the ONNX export")
    code, _, err = run_cli([*run, "--prune-threshold", "0.1"], capsys, monkeypatch)
    _assert_one_error_line(code, err, "--prune-threshold", "torch engine")
    plain = ["translate", "--model", str(dat_onnx["dir"] / "fp32"), "--input", str(src)]
    code, _, err = run_cli([*plain, "--shortlist"], capsys, monkeypatch)
    _assert_one_error_line(code, err, "exported without a shortlist", "--format onnx --shortlist")


def test_a_model_directory_is_exported_with_the_shortlist(dat_onnx_shortlist, monkeypatch):
    """``--engine onnxruntime --shortlist`` on a model directory exports it with that shortlist
    for the run (the export itself is the fixture's, copied in place of exporting again)."""
    import fadat
    from fadat.translation import onnx_export

    calls = []

    def fake_export(directory, target, **options):
        calls.append((Path(directory), options))
        shutil.copytree(dat_onnx_shortlist["dir"] / f"{options['precision']}-sl", target)
        return Path(target)

    monkeypatch.setattr(onnx_export, "export_onnx", fake_export)
    dat = dat_onnx_shortlist["dat"]
    translator = fadat.Translator.from_pretrained(dat, engine="onnxruntime", shortlist=True)
    assert calls == [(dat, {"precision": "fp32", "shortlist": dat})]
    assert translator.model.engine.shortlist is not None
    lines = random_sentences(4, seed=72)
    torch_side = fadat.Translator.from_pretrained(dat, shortlist=True)
    assert translator.translate(lines) == torch_side.translate(lines)
    fadat.Translator.from_pretrained(
        dat, engine="onnxruntime", shortlist=dat_onnx_shortlist["shortlist"], precision="int8"
    )
    assert calls[-1] == (
        dat,
        {"precision": "int8", "shortlist": dat_onnx_shortlist["shortlist"]},
    )


def test_evaluate_and_serve_on_a_shortlisted_export(dat_onnx_shortlist, engines):
    """``fadat evaluate`` loads a shortlisted export with or without ``--shortlist`` and records
    the shortlist in the model's entry (pruning stays refused); the server's engine translates
    with it."""
    from fadat.evaluation.evaluate import _model_record, load_engine_model
    from fadat.serve.engine import Engine

    export = dat_onnx_shortlist["dir"] / "fp32-sl"
    cpu = torch.device("cpu")
    for shortlist in (None, True):
        model, _ = load_engine_model(export, "auto", cpu, shortlist=shortlist)
        assert _model_record("x", model, export)["shortlist"] is True
    torch_model, _ = load_engine_model(dat_onnx_shortlist["dat"], "torch", cpu, shortlist=True)
    assert _model_record("y", torch_model, dat_onnx_shortlist["dat"])["shortlist"] is True
    with pytest.raises(InputError, match="--prune-threshold"):
        load_engine_model(export, "auto", cpu, shortlist=True, prune_threshold=0.1)
    lines = random_sentences(4, seed=73)
    server = Engine.from_directory(export)
    got = [r.text for r in server.translate(lines, "lookahead", {})]
    assert got == engines["fp32"].translate(lines)


def test_a_shortlisted_export_runs_without_torch(dat_onnx_shortlist, engines):
    """The engine reads an export's shortlist and computes the candidates without torch: in a
    process whose import of torch fails, the fp32 shortlisted export translates as here
    (lookahead and the beam search)."""
    import subprocess
    import sys

    from test_engine_decoding import BLOCK_TORCH, ROOT

    lines = random_sentences(6, seed=81)
    code = BLOCK_TORCH + (
        "import json\n"
        "from fadat.engine.runtime import OnnxDAT\n"
        f"engine = OnnxDAT({str(dat_onnx_shortlist['dir'] / 'fp32-sl')!r})\n"
        "assert engine.shortlist is not None\n"
        f"lines = {lines!r}\n"
        "out = [engine.translate(lines, s) for s in ('lookahead', 'beam')]\n"
        "assert 'torch' not in sys.modules\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    engine = engines["fp32"]
    assert json.loads(out.stdout) == [engine.translate(lines, s) for s in ("lookahead", "beam")]
