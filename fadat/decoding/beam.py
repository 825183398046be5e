"""Beam search over output prefixes with an optional n-gram language model (thu-coai/DAG-Search;
docs/reference-behaviour.md): a per-sentence NumPy/Python search on the CPU, as the reference's
(C++/OpenMP) one is; the language model needs the ``kenlm`` package. Conventions:
:mod:`fadat.decoding`.

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
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fadat.data.contract import PAD_ID
from fadat.decoding.paths import Hypothesis, output_tokens, path_score


class _LanguageModel:
    """KenLM scores (log10) of output prefixes, cached per trie node."""

    def __init__(self, lm: Any, words: Sequence[str]) -> None:
        import kenlm

        self.model = (
            kenlm.Model(str(lm))
            if isinstance(lm, (str, bytes)) or hasattr(lm, "__fspath__")
            else lm
        )
        self.words = list(words)
        self._kenlm = kenlm

    def begin(self) -> Any:
        state = self._kenlm.State()
        self.model.BeginSentenceWrite(state)
        return state

    def step(self, state: Any, token: int) -> tuple[float, Any]:
        out = self._kenlm.State()
        return self.model.BaseScore(state, self.words[token], out), out

    def finish(self, state: Any) -> float:
        return self.model.BaseScore(state, "</s>", self._kenlm.State())


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
    module docstring (:mod:`fadat.decoding.beam`).

    Runs per sentence on the CPU in float64. Without an LM, each vertex's merging, pruning and
    expansion are NumPy array operations and prefixes are identified by a 64-bit hash (see
    :func:`_beam_one_fast`; a hash collision, probability < 1e-9 per sentence, would merge two
    prefixes); with an LM, the plain trie/dict search :func:`_beam_one_reference` runs (exact
    prefix identity, one Python step per state and candidate). Tests check both give the same
    results.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.
        beam_size: states kept per vertex (``--decode-beamsize``).
        max_beam_per_length: states kept per vertex and prefix length.
        top_cand_n: tokens per destination vertex.
        top_p: candidate mass per source vertex in (0, 1]; 1 keeps all.
        max_successors: cap on candidate pairs per source vertex (None = no cap).
        alpha: α, length-normalisation exponent (``--decode-alpha``).
        lm: optional KenLM model (``kenlm.Model``) or path of an ARPA/binary file; needs the
            optional ``kenlm`` package.
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
    language_model = None
    if lm is not None:
        if lm_words is None:
            raise ValueError("lm_words (the LM word of each token id) is required with lm")
        language_model = _LanguageModel(lm, lm_words)
    lp_all = token_logprobs.detach().to("cpu", torch.float64).numpy()  # (B, L, V)
    ln_all = links.detach().to("cpu", torch.float64).numpy()  # (B, L, L)
    out = []
    # The search allocates many small linked containers and frees nothing until the sentence
    # ends; the cyclic garbage collector would re-traverse them all again and again.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for b, n in enumerate(graph_lengths.tolist()):
            args = (lp_all[b, :n], ln_all[b, :n, :n], beam_size, max_beam_per_length)
            args += (top_cand_n, top_p, max_successors, alpha)
            if language_model is None:
                out.append(_beam_one_fast(*args))
            else:
                out.append(_beam_one_reference(*args, language_model, gamma))
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def _check_options(
    beam_size: int,
    max_beam_per_length: int,
    top_cand_n: int,
    top_p: float,
    max_successors: int | None,
) -> None:
    """Raise ValueError for :func:`beam_search`'s out-of-range pruning options."""
    if beam_size < 1 or max_beam_per_length < 1 or top_cand_n < 1:
        raise ValueError("beam_size, max_beam_per_length and top_cand_n must be >= 1")
    if max_successors is not None and max_successors < 1:
        raise ValueError(f"max_successors must be >= 1, got {max_successors}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


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


# splitmix64 finaliser constants: a prefix's 64-bit identity is mix(parent · K + token + 1).
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_FREE_SALT = np.uint64(0xD6E8FEB86659FD93)


def _extend_hash(h: np.ndarray, t: np.ndarray) -> np.ndarray:
    """64-bit identities of prefixes ``h`` extended by tokens ``t`` (uint64 arithmetic wraps)."""
    z = h * _HASH_MUL + (t.astype(np.uint64) + np.uint64(1))
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _group_states(chunks: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """Merge contributions with equal (prefix, flag) key: log-sum-exp of scores, best single."""
    columns = zip(*chunks, strict=True)
    key, h, free, length, last, score, best, back, tok = (np.concatenate(c) for c in columns)
    order = np.lexsort((-best, key))  # by key, best contribution first within a key
    key_s = key[order]
    starts = np.flatnonzero(np.r_[True, key_s[1:] != key_s[:-1]])
    counts = np.diff(np.r_[starts, len(order)])
    sc = score[order]
    peak = np.maximum.reduceat(sc, starts)  # (G,)
    lse = peak + np.log(np.add.reduceat(np.exp(sc - np.repeat(peak, counts)), starts))  # (G,)
    first = order[starts]  # (G,) each group's best contribution
    keep = (h, free, length, last)
    return (*(x[first] for x in keep), lse, best[first], back[first], tok[first])


def _top_tokens(lp: np.ndarray, top_cand_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each vertex's top ``min(top_cand_n, V)`` tokens ``(L_b, n)`` int64, their log-probs
    ``(L_b, n)`` float64 and its argmax token ``(L_b,)``, from ``lp`` ``(L_b, V)``."""
    n = min(top_cand_n, lp.shape[1])
    top_tok = _top_n(lp, n)  # (L, n)
    top_lp = np.take_along_axis(lp, top_tok, axis=1)  # (L, n)
    return top_tok, top_lp, lp.argmax(axis=1)


def _top_n(lp: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` columns of ``np.argsort(-lp, axis=1, kind="stable")`` ``(L, n)`` int64
    (largest first, ties by lower token id), in O(L·V) rather than O(L·V·log V): the n-th
    largest value of each row by ``np.partition``, the tokens above it and, among those equal
    to it, the lowest ids, then a stable sort of those n. Rows with a NaN take the full sort
    (its NaN order)."""
    L, V = lp.shape
    if n >= V or np.isnan(lp).any():
        return np.argsort(-lp, axis=1, kind="stable")[:, :n]
    kth = np.partition(lp, V - n, axis=1)[:, V - n : V - n + 1]  # (L, 1) the n-th largest
    above = lp > kth  # (L, V)
    tied = lp == kth  # (L, V)
    room = n - above.sum(axis=1, keepdims=True)  # (L, 1) tied tokens to take, >= 1
    chosen = above | (tied & (np.cumsum(tied, axis=1) <= room))  # exactly n per row
    cols = np.nonzero(chosen)[1].reshape(L, n)  # (L, n) in id order
    order = np.argsort(-np.take_along_axis(lp, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)


def _two_vertex_hypothesis(lp: np.ndarray, ln: np.ndarray, argmax_tok: np.ndarray) -> Hypothesis:
    """The only path of a graph with just the start and the end vertex: an empty output."""
    path, ptoks = [0, 1], [int(argmax_tok[0]), int(argmax_tok[1])]
    return Hypothesis([], path, ptoks, path_score(lp, ln, path, ptoks))


def _beam_one_fast(
    lp: np.ndarray,
    ln: np.ndarray,
    beam_size: int,
    max_beam_per_length: int,
    top_cand_n: int,
    top_p: float,
    max_successors: int | None,
    alpha: float,
) -> Hypothesis:
    """Beam search of one sentence with array operations per vertex (same search as
    :func:`_beam_one_reference`, without a language model).

    States are arrays; a prefix is identified by a 64-bit mixed hash of its tokens instead of a
    trie node, so merging and expanding are NumPy sorts and reductions. Two different prefixes
    would be merged only on a 64-bit hash collision (probability about ``n²/2⁶⁵`` for ``n``
    prefixes: below 1e-9 for 10⁵ prefixes).

    A state is the tuple of arrays ``(h, free, length, last, lse, best, back, tok)`` (one entry
    per state): prefix hash, free flag, prefix length, last token, log-sum-exp score, best single
    score, back-pointer entry of the best contribution and the token it read. Every state visited
    is an entry of the back-pointer table (``prev``, ``tok``, ``vert`` chunks).
    """
    L = lp.shape[0]
    top_tok, top_lp, argmax_tok = _top_tokens(lp, top_cand_n)
    if L == 2:
        return _two_vertex_hypothesis(lp, ln, argmax_tok)
    end = L - 1
    pending: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(L)]
    prev_chunks = [np.array([-1])]  # back-pointer of every entry, entry 0 = the start vertex
    tok_chunks = [np.array([argmax_tok[0]])]
    vert_chunks = [np.array([0])]
    n_entries = 1
    # the start state: empty prefix, free, score 0
    state = (np.zeros(1, np.uint64), np.ones(1, bool), np.zeros(1, np.int64), np.full(1, -1))
    state += (np.zeros(1), np.zeros(1), np.full(1, -1), np.full(1, argmax_tok[0]))
    for i in range(L - 1):
        if i > 0:
            if not pending[i]:
                continue
            state = _group_states(pending[i])
            pending[i] = []
            ids = n_entries + np.arange(len(state[0]))
            prev_chunks.append(state[6])
            tok_chunks.append(state[7])
            vert_chunks.append(np.full(len(ids), i))
            n_entries += len(ids)
        else:
            ids = np.zeros(1, np.int64)
        length, lse = state[2], state[4]
        rank = lse / np.maximum(length, 1) ** alpha  # (G,)
        kept = _prune_fast(length, rank, max_beam_per_length, beam_size)
        cands = _beam_candidates(ln[i], top_lp, top_tok, i, top_p, max_successors)
        _expand_fast(state, ids[kept], kept, cands, pending)
    if not pending[end]:
        raise ValueError("links has no path from vertex 0 to the end vertex")
    h, free, length, last, lse, best, back, _ = _group_states(pending[end])
    g = int(np.argmax(lse / np.maximum(length, 1) ** alpha))
    prev_all = np.concatenate(prev_chunks)
    tok_all = np.concatenate(tok_chunks)
    vert_all = np.concatenate(vert_chunks)
    path, ptoks = [end], [int(argmax_tok[end])]
    e = int(back[g])
    while e >= 0:
        path.append(int(vert_all[e]))
        ptoks.append(int(tok_all[e]))
        e = int(prev_all[e])
    path.reverse()
    ptoks.reverse()
    ptoks[0] = int(argmax_tok[0])
    return Hypothesis(output_tokens(ptoks), path, ptoks, path_score(lp, ln, path, ptoks))


def _prune_fast(
    length: np.ndarray, rank: np.ndarray, max_beam_per_length: int, beam_size: int
) -> np.ndarray:
    """Indices ``(S,)`` of the states kept at a vertex: the best ``max_beam_per_length`` by
    ``rank`` ``(G,)`` per prefix ``length`` ``(G,)``, then the best ``beam_size`` of those, best
    first (ties in input order, as the reference's stable sort)."""
    order = np.lexsort((-rank, length))  # by length, best rank first within a length
    len_s = length[order]
    starts = np.flatnonzero(np.r_[True, len_s[1:] != len_s[:-1]])
    counts = np.diff(np.r_[starts, len(order)])
    within = np.arange(len(order)) - np.repeat(starts, counts)
    survivors = order[within < max_beam_per_length]
    return survivors[np.argsort(-rank[survivors], kind="stable")[:beam_size]]  # (S,)


def _expand_fast(
    state: tuple[np.ndarray, ...],
    kept_ids: np.ndarray,
    kept: np.ndarray,
    cands: list[tuple[int, int, float]],
    pending: list[list[tuple[np.ndarray, ...]]],
) -> None:
    """Extend the ``kept`` states ``(S,)`` (back-pointer entries ``kept_ids`` ``(S,)``) with the
    source vertex's candidates; each destination vertex ``j`` gets one chunk of ``(S·C_j,)``
    contributions, keyed by (prefix hash, free flag), appended to ``pending[j]``."""
    h, free, length, last, lse, best = state[:6]
    cj = np.array([c[0] for c in cands], dtype=np.int64)  # (C,)
    ct = np.array([c[1] for c in cands], dtype=np.int64)  # (C,)
    cs = np.array([c[2] for c in cands], dtype=np.float64)  # (C,)
    S, C = len(kept), len(cj)
    hk, fk, lk, tk = h[kept, None], free[kept, None], length[kept, None], last[kept, None]
    still = (ct < 0) | (ct == PAD_ID)  # (C,) end vertex or pad: the prefix stays, free
    dup = ~fk & (ct[None, :] == tk) & ~still[None, :]  # (S, C) duplicate of the last token
    grow = ~still[None, :] & ~dup  # (S, C)
    new_h = np.where(grow, _extend_hash(hk, np.maximum(ct, 0)[None, :]), hk)  # (S, C)
    new_free = np.broadcast_to(still[None, :], (S, C))
    key = new_h ^ (new_free.astype(np.uint64) * _FREE_SALT)  # (S, C)
    fields = (
        key,
        new_h,
        new_free,
        lk + grow,
        np.where(grow, ct[None, :], tk),
        lse[kept, None] + cs[None, :],
        best[kept, None] + cs[None, :],
        np.broadcast_to(kept_ids[:, None], (S, C)),
        np.broadcast_to(ct[None, :], (S, C)),
    )
    for j in np.unique(cj).tolist():
        cols = cj == j
        pending[j].append(tuple(f[:, cols].reshape(-1) for f in fields))


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
    (state, candidate). Used with a language model (which scores trie nodes) and as the reference
    that :func:`_beam_one_fast` is tested against.

    A state entry is ``[log-sum-exp score, best single score, back-pointer entry, token, vertex,
    node, free]``, keyed by ``(node, free)`` in its vertex's dict.
    """
    L = lp.shape[0]
    top_tok, top_lp, argmax_tok = _top_tokens(lp, top_cand_n)
    if L == 2:
        return _two_vertex_hypothesis(lp, ln, argmax_tok)
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
