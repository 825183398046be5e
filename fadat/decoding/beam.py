"""Beam search over output prefixes with an optional n-gram language model (thu-coai/DAG-Search;
docs/reference-behaviour.md): a per-sentence search on the CPU compiled with numba, as the
reference's (C++/OpenMP) one is compiled; the language model needs the ``kenlm`` package.
Conventions: :mod:`fadat.decoding`.

Objective: the output ``y`` maximising
``J(y) = (log P(y|x) + γ·lm(y)) / max(1, |y|)^α`` with
``P(y|x) = Σ_a Σ_z P(a|x) Π_{intermediate v_k ∈ a} P(z_k | v_k)`` summed over paths ``a`` and
intermediate token choices ``z`` with :func:`output_tokens` ``(· z ·) = y`` (endpoint tokens are
summed out: factor 1). So ``z = t t`` and ``z = t`` give the same ``y = [t]``, pads vanish and
``t <pad> t`` gives ``[t, t]``. An empty output is normalised by ``1`` (``|y|`` clamped to 1).
``lm(y)`` is the KenLM log10 score of ``<s> y </s>`` (0 without an LM).

Search: the state at vertex ``i`` is an output prefix (a trie node) plus a flag "the previous
vertex's token is pad or there was none" (it decides whether the next token equal to the
prefix's last one is a duplicate). A state's score is the log-sum-exp over all partial paths
and token choices reaching it, so paths producing the same prefix merge. Vertices are visited
in order ``0 … L_b − 2``; the states at a vertex are ranked by
``(score + γ·lm(prefix)) / max(1, |prefix|)^α``, at most ``max_beam_per_length`` are kept per
prefix length and ``beam_size`` overall, then each is expanded with the source vertex's
candidates. Without pruning (beams at least the number of states, ``top_cand_n ≥ V``,
``top_p = 1``, ``max_successors = None``) the result is the exact argmax of ``J``.

Candidates of source vertex ``i``: pairs ``(j, y)`` for each later intermediate ``j`` and
``y`` among ``j``'s top ``top_cand_n`` tokens, scored ``links[i, j] + log P(y|j)``, plus one
pair for the end vertex scored ``links[i, L_b − 1]``; sorted by score, truncated once the
probability mass before a pair reaches ``top_p``, then to ``max_successors`` pairs if given.

The reference's ``--decode-top-cand-n n`` is ``top_cand_n = max_successors = n`` (its pairs
are built from each vertex's top ``n`` tokens and ``n`` pairs are kept per source vertex); the
defaults (5, 5) follow it. ``max_successors = None`` removes the cap on pairs.

Deviations from the reference: de-duplication is part of the objective (the reference's
prefixes keep repeats and ``--decode-dedup`` only post-processes them); candidate scores use
``β = 1``; the end vertex's token is summed out rather than read from the candidates; the LM's
``</s>`` score is added at the end vertex (our choice; the reference's end handling was not
checked); no n-gram bans. As in the reference, ``lm`` is in log10 and the DAG score in nats.

Search implementation: :func:`beam_search` takes each vertex's top ``top_cand_n`` tokens
(:func:`top_candidates`) and hands them to :func:`beam_search_candidates`, which reads nothing
else and runs the torch-free search :func:`fadat.engine.beam_np.beam_search` on them as numpy
arrays (the search the ONNX Runtime engine runs on its graph's top tokens, docs/engine.md).
Per sentence, in float64, the compiled search (:mod:`fadat.engine._beam_jit`) keeps prefixes as
nodes of an array trie (exact identity) and states as array rows found through a hash table
keyed ``(node, flag, vertex)``; one compiled step per vertex ranks, prunes and expands. Without
an LM the whole sentence is one compiled call. With one, Python calls the step vertex by vertex
and scores the trie nodes each step created with KenLM (which compiled code cannot call) before
the next step ranks them. The plain trie/dict search
:func:`_beam_one_reference`, one Python step per state and candidate, is the reference it is
tested equal to: same outputs, paths and scores, ties included (states ranked by a stable sort
in insertion order, the first of equal best contributions keeps the back-pointer, the first of
equal final states wins). One difference in the last bit: the top-p cut takes ``exp`` from libm
where the reference takes NumPy's (SIMD on AVX-512 CPUs), and with ``max_successors`` it tests
only the best ``max_successors`` pairs; either changes the cut only when the mass before a pair
equals ``top_p`` within rounding.

Compilation: numba compiles the search on the first call in a process, about 13 s of CPU time
(x86, measured as process time on a shared core), and caches it on disk (``cache=True``: in
``__pycache__`` next to ``fadat/engine/_beam_jit.py``, else in numba's user-wide cache
directory, or in ``NUMBA_CACHE_DIR``); a later process loads it in about 0.3 s of CPU time.
Where no cache directory is writable (a read-only install), every process compiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import fadat.engine.beam_np as beam_np
from fadat.data.contract import PAD_ID
from fadat.decoding.paths import Hypothesis, path_score
from fadat.engine.beam_np import _LanguageModel
from fadat.engine.beam_np import check_options as _check_options


def beam_search(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    *,
    beam_size: int = 100,
    max_beam_per_length: int = 10,
    top_cand_n: int = 5,
    top_p: float = 0.9,
    max_successors: int | None = 5,
    alpha: float = 1.1,
    lm: Any = None,
    lm_words: Sequence[str] | None = None,
    gamma: float = 0.1,
) -> list[Hypothesis]:
    """Prefix-merging beam search over the DAG (thu-coai/DAG-Search; reference-behaviour.md).

    The objective, the search, the candidates and the deviations from the reference are in the
    module docstring (:mod:`fadat.decoding.beam`). Takes each vertex's top ``top_cand_n`` tokens
    (:func:`top_candidates`) and runs :func:`beam_search_candidates` on them.

    Args:
        token_logprobs: ``(B, L, V)`` float, on any device.
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.
        beam_size: states kept per vertex (``--decode-beamsize``).
        max_beam_per_length: states kept per vertex and prefix length.
        top_cand_n: tokens per destination vertex.
        top_p: candidate mass per source vertex in (0, 1]; 1 keeps all.
        max_successors: cap on candidate pairs per source vertex (None = no cap).
        alpha: α, length-normalisation exponent (``--decode-alpha``).
        lm: optional n-gram language model: the path of an ARPA file or a KenLM binary, an
            :class:`~fadat.engine.ngram.NgramModel` or a ``kenlm.Model``
            (:func:`fadat.engine.beam_np.open_model`; a binary needs the optional ``kenlm``
            package).
        lm_words: with ``lm``: the LM word of every token id (e.g. the sentencepiece pieces;
            the verbs pass :func:`fadat.translation.language_model.lm_words`).
        gamma: γ, the LM weight (``--decode-gamma``; used only with ``lm``).

    Returns:
        ``B`` hypotheses. ``Hypothesis.score`` is the score of the single best (path, tokens)
        inside the chosen output's merged states, with the endpoints reading their argmax
        tokens; ``path``/``path_tokens`` are that path.

    Raises:
        ValueError: a non-positive beam/candidate count, ``top_p`` outside (0, 1], or ``lm``
            without ``lm_words``.
        ImportError: ``lm`` given but ``kenlm`` is not installed.
    """
    _check_options(beam_size, max_beam_per_length, top_cand_n, top_p, max_successors)
    n = min(top_cand_n, token_logprobs.shape[-1])
    top_lp, top_tok = top_candidates(token_logprobs, n)  # (B, L, n), (B, L, n)
    return beam_search_candidates(
        top_lp,
        top_tok,
        links,
        graph_lengths,
        beam_size=beam_size,
        max_beam_per_length=max_beam_per_length,
        top_cand_n=n,
        top_p=top_p,
        max_successors=max_successors,
        alpha=alpha,
        lm=lm,
        lm_words=lm_words,
        gamma=gamma,
    )


def beam_search_candidates(
    top_logprobs: torch.Tensor,
    top_tokens: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    *,
    beam_size: int = 100,
    max_beam_per_length: int = 10,
    top_cand_n: int = 5,
    top_p: float = 0.9,
    max_successors: int | None = 5,
    alpha: float = 1.1,
    lm: Any = None,
    lm_words: Sequence[str] | None = None,
    gamma: float = 0.1,
) -> list[Hypothesis]:
    """:func:`beam_search` from each vertex's top tokens instead of the whole ``(B, L, V)``
    log-probabilities: the search reads nothing else (its candidates are among each vertex's
    top ``top_cand_n`` tokens, the endpoints read their argmax, the first column).

    A thin wrapper: the tensors go to the CPU as float64 (int64 tokens) numpy arrays and
    :func:`fadat.engine.beam_np.beam_search` searches them, per sentence in the compiled search
    of :mod:`fadat.engine._beam_jit` (the module docstring of :mod:`fadat.decoding.beam`,
    search implementation). The keyword options are :func:`beam_search`'s; ``top_cand_n`` takes
    the first ``top_cand_n`` of the ``n`` tokens of every vertex.

    Args:
        top_logprobs: ``(B, L, n)`` float, the log-probabilities of ``top_tokens``.
        top_tokens: ``(B, L, n)`` int64, each vertex's ``n`` most likely token ids, by
            log-probability descending, ties by the lower id (:func:`top_candidates`).
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.

    Returns:
        ``B`` hypotheses, as :func:`beam_search`'s (the same on the same inputs).

    Raises:
        ValueError: as :func:`beam_search`; ``top_logprobs`` and ``top_tokens`` of different
            shapes; fewer than ``top_cand_n`` tokens per vertex; ``links`` or
            ``graph_lengths`` of the wrong shape, lengths outside ``[2, L]``; no path from
            vertex 0 to the end vertex.
        ImportError: ``lm`` given but ``kenlm`` is not installed.
    """
    hyps = beam_np.beam_search(
        top_logprobs.detach().to("cpu", torch.float64).numpy(),  # (B, L, n)
        top_tokens.detach().to("cpu", torch.int64).numpy(),  # (B, L, n)
        links.detach().to("cpu", torch.float64).numpy(),  # (B, L, L)
        graph_lengths.detach().to("cpu", torch.int64).numpy(),  # (B,)
        beam_size=beam_size,
        max_beam_per_length=max_beam_per_length,
        top_cand_n=top_cand_n,
        top_p=top_p,
        max_successors=max_successors,
        alpha=alpha,
        lm=lm,
        lm_words=lm_words,
        gamma=gamma,
    )
    return [_as_hypothesis(h) for h in hyps]


def _as_hypothesis(h: beam_np.Hypothesis) -> Hypothesis:
    """The engine's hypothesis (:class:`fadat.engine.decoding_np.Hypothesis`) as
    :class:`fadat.decoding.Hypothesis`: the same fields."""
    return Hypothesis(h.tokens, h.path, h.path_tokens, h.score)


def top_candidates(token_logprobs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each vertex's ``n`` most likely tokens, largest first, ties by the lower token id (the
    first ``n`` columns of ``np.argsort(-lp, axis=-1, kind="stable")``), for
    :func:`beam_search_candidates`.

    ``torch.topk`` of ``n + 1`` on the input's dtype and device (a conversion to float64 keeps
    the order, so the tokens are those of the float64 log-probabilities); it does not order
    equal values by id, so the rows where two of the ``n + 1`` values are equal (including the
    ``n``-th and the next: a tie at the boundary) and the rows with a NaN go through
    :func:`_top_n` on the CPU.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        n: tokens per vertex, ``1 ≤ n ≤ V``.

    Returns:
        ``(top_logprobs, top_tokens)``: ``(B, L, n)`` float64 and ``(B, L, n)`` int64, on the
        CPU.
    """
    x = token_logprobs.detach()
    B, L, V = x.shape
    if n >= V:
        lp = x.to("cpu", torch.float64).numpy().reshape(B * L, V)  # (B·L, V)
        tok = _top_n(lp, n)  # (B·L, n)
        top_lp = np.take_along_axis(lp, tok, axis=1)
        return torch.from_numpy(top_lp).view(B, L, n), torch.from_numpy(tok).view(B, L, n)
    vals, idx = x.topk(n + 1, dim=-1)  # (B, L, n + 1), the order of equal values unspecified
    exact = ~((vals[..., 1:] == vals[..., :-1]).any(-1) | x.isnan().any(-1))  # (B, L)
    top_lp = vals[..., :n].to("cpu", torch.float64)  # (B, L, n)
    top_tok = idx[..., :n].to("cpu", torch.int64)  # (B, L, n)
    if not bool(exact.all()):
        rows = tuple(r.cpu() for r in (~exact).nonzero(as_tuple=True))  # (R,), (R,)
        lp = x[rows].to("cpu", torch.float64).numpy()  # (R, V)
        tok = _top_n(lp, n)  # (R, n)
        top_tok[rows] = torch.from_numpy(tok)
        top_lp[rows] = torch.from_numpy(np.take_along_axis(lp, tok, axis=1))
    return top_lp, top_tok


def _top_n(lp: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` columns of ``np.argsort(-lp, axis=1, kind="stable")`` ``(L, n)`` int64:
    largest first, ties by the lower token id, NaN in NumPy's sort order. Only for the rows
    :func:`top_candidates` cannot take from ``torch.topk`` (ties, NaN, ``n ≥ V``) and for the
    reference search, so a full sort of those rows is cheap enough."""
    return np.argsort(-lp, axis=1, kind="stable")[:, :n]


# ----------------------------------------------------------------------------------------------
# The plain reference: a trie and dicts, one Python step per (state, candidate)
# ----------------------------------------------------------------------------------------------


def _top_tokens(lp: np.ndarray, top_cand_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each vertex's top ``min(top_cand_n, V)`` tokens ``(L_b, n)`` int64, their log-probs
    ``(L_b, n)`` float64 and its argmax token ``(L_b,)``, from ``lp`` ``(L_b, V)``."""
    n = min(top_cand_n, lp.shape[1])
    top_tok = _top_n(lp, n)  # (L, n)
    top_lp = np.take_along_axis(lp, top_tok, axis=1)  # (L, n)
    return top_tok, top_lp, lp.argmax(axis=1)


def _beam_candidates(
    links_i: np.ndarray,
    top_lp: np.ndarray,
    top_tok: np.ndarray,
    i: int,
    top_p: float,
    max_successors: int | None,
) -> list[tuple[int, int, float]]:
    """Sorted ``(j, token, score)`` candidates of source vertex ``i``; token −1 = end vertex."""
    L, n = top_lp.shape
    js = np.arange(i + 1, L - 1)  # (J,) intermediate destinations
    sc = (links_i[js, None] + top_lp[js]).reshape(-1)  # (J·n,)
    jj = np.repeat(js, n)  # (J·n,)
    tt = top_tok[js].reshape(-1)  # (J·n,)
    sc = np.append(sc, links_i[L - 1])
    jj = np.append(jj, L - 1)
    tt = np.append(tt, -1)
    order = np.argsort(-sc, kind="stable")
    order = order[np.isfinite(sc[order])]
    if top_p < 1.0:
        w = np.exp(sc[order])
        before = np.cumsum(w) - w
        order = order[before < top_p]
    if max_successors is not None:
        order = order[:max_successors]
    return list(zip(jj[order].tolist(), tt[order].tolist(), sc[order].tolist(), strict=True))


def _two_vertex_hypothesis(
    lp: np.ndarray, ln: np.ndarray, path_tokens: np.ndarray, cols: np.ndarray
) -> Hypothesis:
    """:func:`fadat.engine.beam_np._two_vertex_hypothesis` (the only path of a 2-vertex graph)
    as :class:`fadat.decoding.Hypothesis`."""
    return _as_hypothesis(beam_np._two_vertex_hypothesis(lp, ln, path_tokens, cols))


class _Trie:
    """Output prefixes of one sentence's search: node ``0`` is the empty prefix; each node keeps
    its parent, last token, length and (with a language model) its LM score and state."""

    def __init__(self, lm: _LanguageModel | None) -> None:
        self.lm = lm
        self.parent, self.tok, self.length, self.lm_score = [-1], [-1], [0], [0.0]
        self.lm_state = [lm.begin() if lm is not None else None]
        self.children: dict[tuple[int, int], int] = {}

    def child(self, node: int, t: int) -> int:
        """The node of prefix ``node`` extended by token ``t`` (created on first use)."""
        c = self.children.get((node, t))
        if c is None:
            c = len(self.tok)
            self.children[(node, t)] = c
            self.parent.append(node)
            self.tok.append(t)
            self.length.append(self.length[node] + 1)
            if self.lm is not None:
                s, st = self.lm.step(self.lm_state[node], t)
                self.lm_score.append(self.lm_score[node] + s)
                self.lm_state.append(st)
            else:
                self.lm_score.append(0.0)
                self.lm_state.append(None)
        return c

    def rank(self, score: float, node: int, gamma: float, alpha: float, final: bool) -> float:
        """``(score + γ·lm(prefix)) / max(1, |prefix|)^α``; ``final`` adds the LM's ``</s>``."""
        lm_score = self.lm_score[node]
        if final and self.lm is not None:
            lm_score += self.lm.finish(self.lm_state[node])
        return (score + gamma * lm_score) / (max(1, self.length[node]) ** alpha)

    def tokens(self, node: int) -> list[int]:
        """The output prefix of ``node``, read off the trie."""
        tokens = []
        while node != 0:
            tokens.append(self.tok[node])
            node = self.parent[node]
        tokens.reverse()
        return tokens


def _beam_one_reference(
    lp: np.ndarray,
    ln: np.ndarray,
    beam_size: int,
    max_beam_per_length: int,
    top_cand_n: int,
    top_p: float,
    max_successors: int | None,
    alpha: float,
    lm: _LanguageModel | None,
    gamma: float,
) -> Hypothesis:
    """Beam search of one sentence, plain version: ``lp`` ``(L_b, V)``, ``ln`` ``(L_b, L_b)``.

    Prefixes live in a trie (exact identity) and states in dicts; one Python step per
    (state, candidate). The reference that the compiled search
    (:func:`fadat.engine.beam_np._beam_one_compiled`) is tested against; no decoder calls it.

    A state entry is ``[log-sum-exp score, best single score, back-pointer entry, token, vertex,
    node, free]``, keyed by ``(node, free)`` in its vertex's dict.
    """
    L = lp.shape[0]
    top_tok, top_lp, argmax_tok = _top_tokens(lp, top_cand_n)
    if L == 2:
        return _two_vertex_hypothesis(lp, ln, argmax_tok, argmax_tok)
    trie = _Trie(lm)
    states: list[dict[tuple[int, bool], list]] = [dict() for _ in range(L)]
    states[0][(0, True)] = [0.0, 0.0, None, int(argmax_tok[0]), 0, 0, True]
    end = L - 1
    for i in range(L - 1):
        if not states[i]:
            continue
        entries = sorted(
            states[i].values(),
            key=lambda e: trie.rank(e[0], e[5], gamma, alpha, False),
            reverse=True,
        )
        states[i] = {}
        kept = _prune_reference(entries, trie.length, max_beam_per_length, beam_size)
        cands = _beam_candidates(ln[i], top_lp, top_tok, i, top_p, max_successors)
        _expand_reference(kept, cands, trie, states)
    if not states[end]:
        raise ValueError("links has no path from vertex 0 to the end vertex")
    final = max(states[end].values(), key=lambda e: trie.rank(e[0], e[5], gamma, alpha, True))
    path, ptoks = [], []
    e = final
    while e is not None:
        path.append(e[4])
        ptoks.append(e[3] if e[3] >= 0 else int(argmax_tok[e[4]]))
        e = e[2]
    path.reverse()
    ptoks.reverse()
    ptoks[-1] = int(argmax_tok[end])
    # the chosen output, read off the trie (equals output_tokens(ptoks))
    return Hypothesis(trie.tokens(final[5]), path, ptoks, path_score(lp, ln, path, ptoks))


def _prune_reference(
    entries: list[list], node_len: list[int], max_beam_per_length: int, beam_size: int
) -> list[list]:
    """The ``entries`` (sorted best first) kept at a vertex: at most ``max_beam_per_length`` per
    prefix length (``node_len`` of their trie node) and ``beam_size`` overall."""
    per_len: dict[int, int] = {}
    kept = []
    for e in entries:
        k = node_len[e[5]]
        if per_len.get(k, 0) < max_beam_per_length:
            per_len[k] = per_len.get(k, 0) + 1
            kept.append(e)
            if len(kept) == beam_size:
                break
    return kept


def _expand_reference(
    kept: list[list],
    cands: list[tuple[int, int, float]],
    trie: _Trie,
    states: list[dict[tuple[int, bool], list]],
) -> None:
    """Extend each ``kept`` entry with each ``(j, token, score)`` candidate, merging into
    ``states[j]`` (log-sum-exp of scores; the best single contribution keeps the back-pointer)."""
    children, node_tok = trie.children, trie.tok
    for e in kept:
        score, best, node, free = e[0], e[1], e[5], e[6]
        last = node_tok[node]
        for j, t, sc in cands:
            if t < 0 or t == PAD_ID:
                key = (node, True)  # end vertex (its token is summed out) or pad
            elif not free and t == last:
                key = (node, False)  # consecutive duplicate: the prefix does not grow
            else:
                c = children.get((node, t))
                key = (trie.child(node, t) if c is None else c, False)
            target = states[j]
            entry = target.get(key)
            s_new = score + sc
            if entry is None:
                target[key] = [s_new, best + sc, e, t, j, key[0], key[1]]
            else:
                old = entry[0]
                # log-add-exp inlined: this loop is the search's hot spot
                if old >= s_new:
                    entry[0] = old + math.log1p(math.exp(s_new - old))
                else:
                    entry[0] = s_new + math.log1p(math.exp(old - s_new))
                if best + sc > entry[1]:
                    entry[1], entry[2], entry[3] = best + sc, e, t
