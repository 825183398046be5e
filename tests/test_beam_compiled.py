"""The compiled beam search (fadat.engine._beam_jit) against the plain trie/dict search
(``_beam_one_reference``) on random graphs built to hit ties, pads, duplicates and missing links,
with and without a KenLM language model; ``beam_search_candidates`` against ``beam_search``;
``top_candidates`` against the stable full sort."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_decoding import random_graph
from test_decoding_search import ARPA

from fadat.decoding import beam_search
from fadat.decoding.beam import (
    _beam_one_reference,
    beam_search_candidates,
    top_candidates,
)
from fadat.engine import beam_np
from fadat.engine.beam_np import _LanguageModel

NEG_INF = float("-inf")
# Both searches run the same float64 operations in the same order, so their scores agree to the
# last bit on one machine; the tolerance only leaves room for a libm that differs in the last bit.
SCORE_REL = 1e-9


def tricky_graph(rng: np.random.Generator, L: int, V: int) -> tuple[np.ndarray, np.ndarray]:
    """One sentence's ``(L, V)`` log-probabilities and ``(L, L)`` links with many exact ties
    (few distinct logits per row), −inf tokens and missing links; ``i → i + 1`` is always kept,
    so the end vertex is reachable."""
    logits = rng.integers(-2, 2, size=(L, V)).astype(float)
    logits[rng.random((L, V)) < 0.2] = NEG_INF
    logits[np.arange(L), rng.integers(V, size=L)] = 0.0  # a finite token in every row
    lp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    ln = rng.integers(-2, 2, size=(L, L)).astype(float) * rng.choice([0.5, 1.0])
    i = np.arange(L)
    missing = (i[:, None] >= i[None, :]) | (rng.random((L, L)) < 0.25)
    missing[i[:-1], i[:-1] + 1] = False
    ln[missing] = NEG_INF
    ln[:-1] -= np.logaddexp.reduce(ln[:-1], axis=1, keepdims=True)
    return lp, ln


def random_options(rng: np.random.Generator, L: int, V: int) -> dict:
    exact = L <= 7 and rng.random() < 0.3  # no pruning: every state of a small graph
    return {
        "beam_size": 10**6 if exact else int(rng.choice([1, 2, 3, 5, 20, 100])),
        "max_beam_per_length": 10**6 if exact else int(rng.choice([1, 2, 4, 10])),
        "top_cand_n": int(rng.integers(1, V + 1)),
        "top_p": 1.0 if exact else float(rng.choice([1.0, 0.95, 0.7, 0.4])),
        "max_successors": None if exact else [None, 1, 2, 5][int(rng.integers(4))],
        "alpha": float(rng.choice([0.0, 0.7, 1.1, 2.0])),
    }


def reference(lp, ln, options, lm=None, gamma=0.0):
    order = ("beam_size", "max_beam_per_length", "top_cand_n", "top_p", "max_successors", "alpha")
    return _beam_one_reference(lp, ln, *(options[k] for k in order), lm, gamma)


def assert_same(got, want) -> None:
    assert (got.tokens, got.path, got.path_tokens) == (want.tokens, want.path, want.path_tokens)
    assert got.score == pytest.approx(want.score, rel=SCORE_REL, abs=1e-12)


def batch(graphs: list[tuple[np.ndarray, np.ndarray]]):
    """Pad sentences into ``(B, L, V)``, ``(B, L, L)`` tensors (garbage beyond each length)."""
    L = max(lp.shape[0] for lp, _ in graphs)
    V = graphs[0][0].shape[1]
    tlp = torch.full((len(graphs), L, V), -3.0, dtype=torch.float64)
    ln = torch.full((len(graphs), L, L), -7.0, dtype=torch.float64)
    for b, (lp_b, ln_b) in enumerate(graphs):
        n = lp_b.shape[0]
        tlp[b, :n] = torch.from_numpy(lp_b)
        ln[b, :n, :n] = torch.from_numpy(ln_b)
    lens = torch.tensor([lp.shape[0] for lp, _ in graphs])
    return tlp, ln, lens


@pytest.mark.parametrize("seed", range(6))
def test_compiled_search_equals_reference(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        V = int(rng.integers(2, 6))  # token 1 is <pad>
        graphs = [tricky_graph(rng, int(rng.integers(2, 13)), V) for _ in range(3)]
        graphs.append(tricky_graph(rng, int(rng.choice([2, 3])), V))
        L_max = max(lp.shape[0] for lp, _ in graphs)
        options = random_options(rng, L_max, V)
        hyps = beam_search(*batch(graphs), **options)
        for (lp, ln), h in zip(graphs, hyps, strict=True):
            assert_same(h, reference(lp, ln, options))


@pytest.mark.parametrize("seed", range(4))
def test_compiled_search_with_kenlm_equals_reference(tmp_path, seed):
    kenlm = pytest.importorskip("kenlm")
    path = tmp_path / "tiny.arpa"
    path.write_text(ARPA)
    words = ["w0", "w1", "w2", "w3", "w4"]  # w1 and w4 are out of the LM's vocabulary
    lm = _LanguageModel(kenlm.Model(str(path)), words)
    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        V = int(rng.integers(2, 6))
        graphs = [tricky_graph(rng, int(rng.integers(2, 13)), V) for _ in range(3)]
        options = random_options(rng, max(lp.shape[0] for lp, _ in graphs), V)
        gamma = float(rng.choice([0.1, 1.0, 3.0]))
        hyps = beam_search(*batch(graphs), **options, lm=lm.model, lm_words=words, gamma=gamma)
        for (lp, ln), h in zip(graphs, hyps, strict=True):
            assert_same(h, reference(lp, ln, options, lm, gamma))


@pytest.mark.parametrize("with_lm", [False, True])
def test_compiled_search_grows_its_arena(monkeypatch, tmp_path, with_lm):
    # from a tiny first capacity the arena grows many times, inside the compiled loop (no LM)
    # and between the steps that Python calls (LM)
    monkeypatch.setattr(beam_np, "_arena_capacity", lambda L: 4)
    rng = np.random.default_rng(7)
    lp, ln = tricky_graph(rng, 30, 6)
    options = {"beam_size": 200, "max_beam_per_length": 50, "top_cand_n": 4, "top_p": 1.0}
    options |= {"max_successors": None, "alpha": 1.1}
    lm, kw = None, {}
    if with_lm:
        kenlm = pytest.importorskip("kenlm")
        (tmp_path / "tiny.arpa").write_text(ARPA)
        words = ["w0", "w1", "w2", "w3", "w4", "w5"]
        lm = _LanguageModel(kenlm.Model(str(tmp_path / "tiny.arpa")), words)
        kw = {"lm": lm.model, "lm_words": lm.words, "gamma": 1.0}
    (h,) = beam_search(*batch([(lp, ln)]), **options, **kw)
    assert_same(h, reference(lp, ln, options, lm, kw.get("gamma", 0.0)))


def test_compiled_search_without_a_path_raises():
    lp = np.log(np.full((4, 3), 1 / 3))
    ln = np.full((4, 4), NEG_INF)
    ln[0, 1] = 0.0  # 1 leads nowhere
    with pytest.raises(ValueError, match="no path"):
        beam_search(*batch([(lp, ln)]))


@pytest.mark.parametrize("seed", range(3))
def test_beam_search_candidates_equals_beam_search(seed):
    rng = np.random.default_rng(200 + seed)
    for _ in range(20):
        V = int(rng.integers(2, 8))
        graphs = [tricky_graph(rng, int(rng.integers(2, 13)), V) for _ in range(3)]
        tlp, ln, lens = batch(graphs)
        options = random_options(rng, int(tlp.shape[1]), V)
        extra = int(rng.integers(0, V - options["top_cand_n"] + 1))  # n ≥ top_cand_n
        order = np.argsort(-tlp.numpy(), axis=-1, kind="stable")[
            ..., : options["top_cand_n"] + extra
        ]
        top_tok = torch.from_numpy(order)
        top_lp = torch.gather(tlp, -1, top_tok)
        got = beam_search_candidates(top_lp, top_tok, ln, lens, **options)
        want = beam_search(tlp, ln, lens, **options)
        for g, w in zip(got, want, strict=True):
            assert (g.tokens, g.path, g.path_tokens, g.score) == (
                w.tokens,
                w.path,
                w.path_tokens,
                w.score,
            )


def test_beam_search_candidates_rejects_bad_shapes():
    top_lp = torch.zeros(1, 4, 3, dtype=torch.float64)
    top_tok = torch.zeros(1, 4, 3, dtype=torch.int64)
    ln = torch.zeros(1, 4, 4, dtype=torch.float64)
    lens = torch.tensor([4])
    with pytest.raises(ValueError, match="fewer than top_cand_n"):
        beam_search_candidates(top_lp, top_tok, ln, lens, top_cand_n=4)
    with pytest.raises(ValueError, match=r"\(B, L, n\)"):
        beam_search_candidates(top_lp, top_tok[..., :2], ln, lens, top_cand_n=2)
    with pytest.raises(ValueError, match="top_p"):
        beam_search_candidates(top_lp, top_tok, ln, lens, top_cand_n=3, top_p=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["normal", "ties", "ties-and-inf", "one-finite", "nan"])
def test_top_candidates_equal_the_stable_full_sort(kind, dtype):
    # torch.topk orders equal values arbitrarily; the result must still be the stable sort's
    # (ties by the lower id), at the boundary of the n kept and inside them
    rng = np.random.default_rng(len(kind))
    for _ in range(200):
        B, L, V = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 40))
        n = int(rng.integers(1, V + 1))
        if kind == "normal":
            lp = rng.normal(size=(B, L, V))
        elif kind == "ties":
            lp = rng.integers(-3, 1, size=(B, L, V)).astype(float)
        elif kind == "ties-and-inf":
            lp = rng.integers(-2, 1, size=(B, L, V)).astype(float)
            lp[lp == -2] = -np.inf
        elif kind == "one-finite":
            lp = np.full((B, L, V), -np.inf)
            lp[..., int(rng.integers(V))] = 0.0
        else:
            lp = rng.integers(-3, 1, size=(B, L, V)).astype(float)
            lp[rng.random((B, L, V)) < 0.1] = np.nan
        x = torch.from_numpy(lp).to(dtype)
        lp64 = x.double().numpy()
        want = np.argsort(-lp64, axis=-1, kind="stable")[..., :n]
        top_lp, top_tok = top_candidates(x, n)
        np.testing.assert_array_equal(top_tok.numpy(), want)
        np.testing.assert_array_equal(top_lp.numpy(), np.take_along_axis(lp64, want, axis=-1))
        assert top_lp.dtype == torch.float64 and top_tok.dtype == torch.int64


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"beam_size": 3, "max_beam_per_length": 2, "top_cand_n": 3, "top_p": 0.8},
        {"beam_size": 5, "max_beam_per_length": 1, "max_successors": None, "alpha": 0.7},
        {"beam_size": 50, "max_beam_per_length": 50, "top_cand_n": 2, "max_successors": 4},
    ],
)
def test_compiled_search_equals_reference_on_continuous_scores(options):
    # graphs without ties, as a model's: longer ones, with the defaults and pruning variants
    tlp, ln, lens = random_graph(6, 30, 8, seed=30, sharp=1.5)
    full = {"top_cand_n": 5, "top_p": 0.9, "max_successors": 5, "alpha": 1.1}
    full |= {"beam_size": 100, "max_beam_per_length": 10} | options
    for b, h in enumerate(beam_search(tlp, ln, lens, **options)):
        n = int(lens[b])
        assert_same(h, reference(tlp[b, :n].numpy(), ln[b, :n, :n].numpy(), full))
