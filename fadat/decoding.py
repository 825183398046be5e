"""Decoders that read a translation off a DAG (paper §3 Eq. 21-22; docs/reference-behaviour.md).

Every decoder consumes the model's two outputs and nothing else:

- ``token_logprobs``: ``(B, L, V)`` float, ``log P(token | vertex)``;
- ``links``: ``(B, L, L)`` float, ``log E[i, j]`` (−inf where ``j ≤ i`` or ``j ≥ L_b``; every row
  ``i < L_b − 1`` log-sums to 0; row ``L_b − 1`` and padding rows are all −inf);
- ``graph_lengths``: ``(B,)`` int64 graph sizes ``L_b``.

A path starts at vertex 0, ends at vertex ``L_b − 1`` and visits strictly increasing vertices.
Each decoder returns one :class:`Hypothesis` per sentence:

- ``path``: the vertex sequence ``0 … L_b − 1``;
- ``path_tokens``: the token read at every path vertex, endpoints included;
- ``tokens``: the output, :func:`output_tokens` of ``path_tokens``: the endpoints' tokens are
  dropped, then consecutive duplicates are removed (a token equal to the previous *vertex's*
  token is skipped), then ``<pad>`` ids are dropped (the reference skips a vertex's token if it
  equals the previously visited vertex's token or is pad; lookahead with n-gram bans is the
  exception: it keeps repeats, see :func:`lookahead`). Other special ids emitted at intermediate
  vertices are kept. Unlike the reference, which de-duplicates the whole sequence and strips
  ``<s>``/``</s>`` afterwards, the endpoints are removed first, so an intermediate ``<s>`` right
  after the start vertex is kept;
- ``score``: ``log P(a|x) + Σ_{v ∈ a} log P(path_token_v | v)`` (natural log), i.e. the sum of
  the path's links plus the log-probability of every path token, endpoints included.

Strategies (the :data:`STRATEGIES` registry; :func:`decode` dispatches by name):
``greedy``, ``lookahead``, ``viterbi``, ``joint-viterbi``, ``sample``, ``beam``.
``s_v = max_y log P(y|v)`` and the argmax token come from :func:`vertex_top1`.

Greedy, lookahead, Viterbi and the candidate tables of sampling are batched tensor code and run
on the device of the inputs (CUDA was not run: this machine has no GPU). Beam search is a
per-sentence NumPy/Python search on the CPU, as the reference's (C++/OpenMP) one is; its
optional n-gram language model needs the ``kenlm`` package (not a core dependency).
"""

from __future__ import annotations

import gc
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from fadat.data.contract import PAD_ID

#: Weight a banned candidate keeps in sampling, as in the reference
#: (docs/reference-behaviour.md, sampling), before renormalisation.
BANNED_WEIGHT = 1e-5

NEG_INF = float("-inf")

# Candidate-pair score tensors are built for at most this many (sentence, i, j, token) entries
# at once (64 MiB of float32).
_PAIR_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Hypothesis:
    """One decoded sentence.

    Attributes:
        tokens: output token ids (endpoints dropped, consecutive duplicates removed, pad dropped).
        path: vertex ids from 0 to ``L_b − 1``, strictly increasing.
        path_tokens: the token id read at each vertex of ``path`` (same length as ``path``).
        score: ``log P(path|x) + Σ_v log P(path_token_v | v)`` in nats.
    """

    tokens: list[int]
    path: list[int]
    path_tokens: list[int]
    score: float


class VertexTop1(NamedTuple):
    """The token head reduced to what greedy, lookahead without n-gram bans, Viterbi and
    joint-Viterbi read (:data:`TOP1_STRATEGIES`): every vertex's best token and its
    log-probability. :func:`decode` accepts it in place of ``token_logprobs``, so a model can
    skip the ``(B, L, V)`` log-probabilities (fadat.inference).

    Attributes:
        s: ``(B, L)`` float, ``s_v = max_y log P(y|v)``.
        tok: ``(B, L)`` int64, the argmax token of every vertex.
    """

    s: torch.Tensor
    tok: torch.Tensor


#: The strategies that read the token head only through :class:`VertexTop1`.
TOP1_STRATEGIES = ("greedy", "lookahead", "viterbi", "joint-viterbi")


# ----------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------


def vertex_top1(token_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Best token of every vertex: ``s_v = max_y log P(y|v)`` and its id.

    Args:
        token_logprobs: ``(B, L, V)`` float log-probabilities.

    Returns:
        ``(s, tok)``: ``(B, L)`` float ``s_v`` and ``(B, L)`` int64 argmax token ids (the lowest
        id on ties).
    """
    if isinstance(token_logprobs, VertexTop1):
        return token_logprobs.s, token_logprobs.tok
    s, tok = token_logprobs.max(dim=-1)  # (B, L), (B, L)
    return s, tok


def output_tokens(path_tokens: Sequence[int]) -> list[int]:
    """The output sentence of a path's tokens (docs/reference-behaviour.md, post-processing).

    Drops the first and last token (the endpoints), then skips every token equal to the previous
    vertex's token (consecutive de-duplication on the raw sequence), then drops ``<pad>``. So
    ``a a b`` → ``a b`` and ``a <pad> a`` → ``a a``.

    Args:
        path_tokens: token ids at the vertices of a path, endpoints included.

    Returns:
        The output token ids.
    """
    out: list[int] = []
    prev: int | None = None
    for t in list(path_tokens)[1:-1]:
        if t != prev and t != PAD_ID:
            out.append(int(t))
        prev = t
    return out


def path_score(
    token_logprobs: torch.Tensor | np.ndarray,
    links: torch.Tensor | np.ndarray,
    path: Sequence[int],
    path_tokens: Sequence[int],
) -> float:
    """``log P(a|x) + Σ_v log P(path_token_v | v)`` of one sentence's path (the Hypothesis score).

    Args:
        token_logprobs: ``(L, V)`` log-probabilities of one sentence.
        links: ``(L, L)`` log transition probabilities of one sentence.
        path: vertex ids of the path.
        path_tokens: token ids at the path's vertices.

    Returns:
        The score in nats (−inf if the path uses a missing edge).
    """
    lp = np.asarray(
        token_logprobs.detach().cpu() if torch.is_tensor(token_logprobs) else token_logprobs
    )
    ln = np.asarray(links.detach().cpu() if torch.is_tensor(links) else links)
    p = np.asarray(path, dtype=np.int64)
    t = np.asarray(path_tokens, dtype=np.int64)
    return float(ln[p[:-1], p[1:]].astype(np.float64).sum() + lp[p, t].astype(np.float64).sum())


def _check_inputs(
    token_logprobs: torch.Tensor, links: torch.Tensor, graph_lengths: torch.Tensor
) -> None:
    if isinstance(token_logprobs, VertexTop1):
        token_logprobs = token_logprobs.s[..., None]  # (B, L, 1): the shapes to check
    if token_logprobs.dim() != 3:
        raise ValueError(
            f"token_logprobs must be (B, L, V), got shape {tuple(token_logprobs.shape)}"
        )
    B, L, _ = token_logprobs.shape
    if tuple(links.shape) != (B, L, L):
        raise ValueError(f"links must be (B, L, L) = {(B, L, L)}, got {tuple(links.shape)}")
    if tuple(graph_lengths.shape) != (B,):
        raise ValueError(f"graph_lengths must be (B,) = ({B},), got {tuple(graph_lengths.shape)}")
    if graph_lengths.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"graph_lengths must be an integer tensor, got {graph_lengths.dtype}")
    if B and (int(graph_lengths.min()) < 2 or int(graph_lengths.max()) > L):
        raise ValueError(f"graph lengths must lie in [2, {L}], got {graph_lengths.tolist()}")


def _working_dtype(x: torch.Tensor) -> torch.Tensor:
    # Half precision sums of ~100 log-probabilities lose too much; float64 input stays float64.
    if isinstance(x, VertexTop1):
        return VertexTop1(_working_dtype(x.s), x.tok)
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _hypotheses_from_paths(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    paths: torch.Tensor,
    path_tokens: torch.Tensor,
    path_lengths: torch.Tensor,
    output_rule: Callable[[Sequence[int]], list[int]] = output_tokens,
) -> list[Hypothesis]:
    """Batched scores of padded paths, then one :class:`Hypothesis` per row.

    ``paths``/``path_tokens``: ``(B, K)`` int64, valid up to ``path_lengths`` ``(B,)``;
    ``output_rule`` turns a path's tokens into the output (:func:`output_tokens` by default).
    """
    B, K = paths.shape
    steps = torch.arange(K, device=paths.device)  # (K,)
    on_path = steps[None, :] < path_lengths[:, None]  # (B, K)
    has_edge = steps[None, 1:] < path_lengths[:, None]  # (B, K-1)
    safe = paths.clamp(max=links.shape[1] - 1)
    edge_idx = safe[:, :-1] * links.shape[2] + safe[:, 1:]  # (B, K-1) flat index into (L, L)
    edge_lp = links.reshape(B, -1).gather(1, edge_idx)  # (B, K-1)
    if isinstance(token_logprobs, VertexTop1):  # the path tokens are the argmax tokens
        vert_lp = token_logprobs.s.gather(1, safe)  # (B, K)
    else:
        vert_idx = safe * token_logprobs.shape[2] + path_tokens  # (B, K) flat index into (L, V)
        vert_lp = token_logprobs.reshape(B, -1).gather(1, vert_idx)  # (B, K)
    zero = torch.zeros((), dtype=edge_lp.dtype, device=edge_lp.device)
    score = torch.where(has_edge, edge_lp, zero).sum(1) + torch.where(on_path, vert_lp, zero).sum(1)
    out = []
    for p, t, n, s in zip(
        paths.tolist(), path_tokens.tolist(), path_lengths.tolist(), score.tolist(), strict=True
    ):
        out.append(Hypothesis(output_rule(t[:n]), p[:n], t[:n], float(s)))
    return out


# ----------------------------------------------------------------------------------------------
# Greedy and lookahead (paper Eq. 21-22)
# ----------------------------------------------------------------------------------------------


def _walk(
    next_vertex: torch.Tensor, graph_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow ``next_vertex`` from vertex 0 to ``L_b − 1`` for the whole batch at once.

    Args:
        next_vertex: ``(B, L)`` int64 successor of each vertex.
        graph_lengths: ``(B,)`` int64.

    Returns:
        ``(paths, lengths)``: ``(B, K)`` int64 vertex ids (rows repeat their end vertex after it
        is reached) and ``(B,)`` int64 path lengths.

    Raises:
        ValueError: a successor does not move forward (a row of ``links`` without valid entries).
    """
    B, L = next_vertex.shape
    end = graph_lengths.to(next_vertex.device) - 1  # (B,)
    cur = torch.zeros(B, dtype=torch.int64, device=next_vertex.device)  # (B,)
    done = cur == end
    steps = [cur]
    for _ in range(L):
        if bool(done.all()):
            break
        nxt = next_vertex.gather(1, cur[:, None]).squeeze(1)  # (B,)
        if bool(((nxt <= cur) & ~done).any()):
            raise ValueError("links has a row without a valid successor before the end vertex")
        cur = torch.where(done, cur, nxt)
        steps.append(cur)
        done = cur == end
    paths = torch.stack(steps, 1)  # (B, K)
    lengths = (paths != end[:, None]).sum(1) + 1  # (B,) the end vertex counted once
    return paths, lengths


def walk_links(
    links: torch.Tensor, graph_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy path (``next = argmax_j links[i, j]`` from vertex 0) of every sentence, as
    :func:`greedy` finds it: ``(paths (B, K), lengths (B,))`` int64 (see :func:`_walk`)."""
    return _walk(_working_dtype(links).argmax(dim=2), graph_lengths)


def greedy(
    token_logprobs: torch.Tensor, links: torch.Tensor, graph_lengths: torch.Tensor
) -> list[Hypothesis]:
    """Greedy decoding (paper Eq. 21).

    From vertex 0, ``next = argmax_j links[i, j]`` until the end vertex; every path vertex reads
    its argmax token. One batched argmax plus a batched walk (no per-sentence loop).

    Args:
        token_logprobs: ``(B, L, V)`` float log P(token|vertex).
        links: ``(B, L, L)`` float log E.
        graph_lengths: ``(B,)`` int64.

    Returns:
        ``B`` hypotheses.
    """
    return _lookahead_like(token_logprobs, links, graph_lengths, beta=None)


def _lookahead_like(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    beta: float | None,
) -> list[Hypothesis]:
    token_logprobs, links = _working_dtype(token_logprobs), _working_dtype(links)
    s, tok = vertex_top1(token_logprobs)  # (B, L), (B, L)
    # β = 0 reads no s (and 0·(−inf) of a pruned vertex would be NaN, fadat.inference)
    scores = links if not beta else links + beta * s[:, None, :]  # (B, L, L)
    next_vertex = scores.argmax(dim=2)  # (B, L)
    paths, lengths = _walk(next_vertex, graph_lengths)  # (B, K), (B,)
    path_tokens = tok.gather(1, paths)  # (B, K)
    return _hypotheses_from_paths(token_logprobs, links, paths, path_tokens, lengths)


def lookahead(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    *,
    beta: float = 1.0,
    top_cand_n: int = 5,
    top_p: float = 0.9,
    no_consecutive_repeated_ngram: int = 0,
    no_repeated_ngram: int = 0,
) -> list[Hypothesis]:
    """Lookahead decoding (paper Eq. 22; docs/reference-behaviour.md, lookahead).

    Without n-gram bans: ``next = argmax_j (links[i, j] + β·s_j)`` and every path vertex reads its
    argmax token, as in the reference (β multiplies the *token* score, ``--decode-beta``). One
    batched argmax plus a batched walk.

    With ``no_consecutive_repeated_ngram = k > 0`` or ``no_repeated_ngram = n > 0``
    (docs/reference-behaviour.md, n-gram bans), the reference's walk: at vertex ``i`` the
    candidates are the top ``top_cand_n`` pairs ``(j, y)`` by ``links[i, j] + β·log P(y|j)``
    (``y`` among ``j``'s top ``top_cand_n`` tokens, the end vertex included). The walk takes the
    first candidate whose token is not banned; if the probability mass ``exp(score)`` of the
    skipped banned candidates exceeds ``top_p``, or all are banned, it takes the top candidate,
    banned or not. Bans look at the *chosen* tokens so far (every candidate token taken at an
    intermediate vertex, pads and repeats included, after the start vertex's token), not at the
    output: banned are the previous chosen token (always, once any ban is on; so after a
    ``<pad>`` the pad is banned and the token before it is free), a token that would make the
    last ``m`` chosen tokens repeat the ``m`` before them for ``2 ≤ m ≤ k``, and a token
    completing an ``n``-gram already chosen. The output is the chosen intermediate tokens with
    pads dropped and *without* de-duplication: a fallback to a banned previous token keeps the
    repeat. Deviation: ``n = 1`` bans every token already chosen (in the reference it bans
    nothing). The candidate tables are batched; the ban checks walk each sentence in Python.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.
        beta: β ≥ 0, weight of the token score.
        top_cand_n: candidates per vertex when bans are on (≥ 1).
        top_p: skipped-mass threshold when bans are on.
        no_consecutive_repeated_ngram: k ≥ 0 (0 = off).
        no_repeated_ngram: n ≥ 0 (0 = off).

    Returns:
        ``B`` hypotheses; with bans, ``path_tokens`` are the chosen candidates' tokens and
        ``tokens`` keeps their repeats (see above).

    Raises:
        ValueError: a negative option or ``top_cand_n < 1``.
    """
    _check_ban_options(no_consecutive_repeated_ngram, no_repeated_ngram)
    if no_consecutive_repeated_ngram == 0 and no_repeated_ngram == 0:
        return _lookahead_like(token_logprobs, links, graph_lengths, beta=beta)
    table = _candidate_table(
        token_logprobs, links, graph_lengths, top_cand_n, beta, 1.0, None, end_as_vertex=True
    )
    return _candidate_walk(
        token_logprobs,
        links,
        graph_lengths,
        table,
        sample=False,
        top_p=top_p,
        consecutive=max(1, no_consecutive_repeated_ngram),
        repeated=no_repeated_ngram,
        rng=None,
    )


# ----------------------------------------------------------------------------------------------
# Viterbi and joint-Viterbi (Shao et al. 2022; docs/reference-behaviour.md)
# ----------------------------------------------------------------------------------------------


def _viterbi(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    joint: bool,
    length_penalty: float,
    max_length: int | None,
) -> list[Hypothesis]:
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    token_logprobs, links = _working_dtype(token_logprobs), _working_dtype(links)
    B, L, _ = links.shape
    device = links.device
    s, tok = vertex_top1(token_logprobs)  # (B, L), (B, L)
    end = graph_lengths.to(device) - 1  # (B,)
    vertex = torch.arange(L, device=device)  # (L,)
    intermediate = (vertex[None, :] >= 1) & (vertex[None, :] < end[:, None])  # (B, L)
    emit = s if joint else torch.zeros_like(s)  # (B, L)
    emit = emit.masked_fill(~intermediate, NEG_INF)  # (B, L): only intermediates may be visited
    to_end = links.gather(2, end[:, None, None].expand(B, L, 1)).squeeze(2)  # (B, L) links[j, end]

    K = max(int(end.max()) - 1, 0) if B else 0
    if max_length is not None:
        K = min(K, max_length)
    # links_t[b, j, i] = links[b, i, j]: the max over predecessors i runs over contiguous memory.
    links_t = links.transpose(1, 2).contiguous()  # (B, L, L)
    # a_k[j] (best score of k intermediate vertices ending at j) is −inf for j < k, so only its
    # tail a[:, j - k] for j ≥ k is kept, and each step computes the lower-right block only.
    a = links[:, 0, 1:] + emit[:, 1:]  # (B, L-1): a_1[j], j ≥ 1
    if joint:
        a = a + s[:, :1]  # the start vertex's s_0, in the objective as in the reference
    ends_val, ends_arg = [], []  # per k: best a_k[j] + links[j, end] and its j
    backptr: list[torch.Tensor] = []  # backptr[k-2][b, j - k]: predecessor of j, k vertices
    for k in range(1, K + 1):
        if k > 1:
            # a_k[j] = max_{i ≥ k−1} a_{k−1}[i] + links[i, j] (+ s_j), j ≥ k
            block = a[:, None, :-1] + links_t[:, k:, k - 1 : L - 1]  # (B, L-k, L-k) [b, j, i]
            val, arg = block.max(dim=2)  # (B, L-k)
            a = val + emit[:, k:]  # (B, L-k)
            backptr.append(arg)  # predecessor i = arg + (k − 1)
        val, arg = (a + to_end[:, k:]).max(dim=1)  # (B,), (B,)
        ends_val.append(val)
        ends_arg.append(arg + k)
    best_l = [NEG_INF] * B
    k_l = j_l = [0] * B
    if K:
        ks = torch.arange(1, K + 1, dtype=links.dtype, device=device)  # (K,)
        norm = torch.stack(ends_val) / ks[:, None] ** length_penalty  # (K, B)
        best, best_k = norm.max(dim=0)  # (B,): ties keep the smallest k
        best_j = torch.stack(ends_arg).gather(0, best_k[None]).squeeze(0)  # (B,)
        best_l, k_l, j_l = best.tolist(), (best_k + 1).tolist(), best_j.tolist()

    # Back-tracking is O(k) per sentence on the CPU: the lists are built there anyway.
    bps = [bp.cpu().numpy() for bp in backptr]  # (B, L-k) each
    end_l = end.tolist()
    paths = []
    for b in range(B):
        if best_l[b] == NEG_INF:
            paths.append([0, end_l[b]])  # no path with 1 ≤ k ≤ K: the direct edge (or L_b = 2)
            continue
        rev, j = [end_l[b]], j_l[b]
        for k in range(k_l[b], 0, -1):
            rev.append(j)
            if k > 1:
                j = int(bps[k - 2][b, j - k]) + (k - 1)
        rev.append(0)
        paths.append(rev[::-1])
    return _pad_and_score(token_logprobs, links, paths, tok)


def _pad_and_score(
    token_logprobs: torch.Tensor, links: torch.Tensor, paths: list[list[int]], tok: torch.Tensor
) -> list[Hypothesis]:
    device = links.device
    K = max(len(p) for p in paths) if paths else 0
    padded = torch.tensor([p + [p[-1]] * (K - len(p)) for p in paths], dtype=torch.int64)
    padded = padded.reshape(len(paths), K).to(device)  # (B, K)
    lengths = torch.tensor([len(p) for p in paths], dtype=torch.int64, device=device)  # (B,)
    return _hypotheses_from_paths(token_logprobs, links, padded, tok.gather(1, padded), lengths)


def viterbi(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    *,
    length_penalty: float = 1.0,
    max_length: int | None = None,
) -> list[Hypothesis]:
    """Length-normalised best path (Shao et al. 2022; docs/reference-behaviour.md, Viterbi).

    Finds the path maximising ``(Σ_edges links) / k^β_v`` over paths with ``k ≥ 1``
    intermediate vertices (vertices strictly between the endpoints), ``k ≤ max_length`` if given.
    One batched DP over ``k`` (``a_{k+1}[j] = max_i a_k[i] + links[i, j]``) on any device; the
    reference is GPU-only. Every path vertex then reads its argmax token.

    Differences from the reference: the objective is Σ links only. The reference starts its DP
    with ``a_1[j] = links[0, j] + s_j`` and adds no token score afterwards, so its objective also
    holds ``s`` of the path's *first intermediate vertex* (the vertex after the start), for every
    length ``k``; no other vertex's score (neither the start's nor the end's) enters. fadat does
    not add it. ``K`` defaults to ``L_b − 2`` (all lengths) instead of the reference's
    ``int(2·L/λ)``. A graph of 2 vertices has no intermediate vertex: path ``[0, 1]``, empty
    output. If no path with ``1 ≤ k ≤ K`` has a finite score, the direct path ``[0, L_b − 1]`` is
    returned. Ties keep the smallest ``k``.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.
        length_penalty: β_v (``--decode-viterbibeta``), default 1.
        max_length: optional upper bound on ``k``.

    Returns:
        ``B`` hypotheses.

    Raises:
        ValueError: ``max_length < 1``.
    """
    return _viterbi(token_logprobs, links, graph_lengths, False, length_penalty, max_length)


def joint_viterbi(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    *,
    length_penalty: float = 1.0,
    max_length: int | None = None,
) -> list[Hypothesis]:
    """Joint-Viterbi (paper §4.1; Shao et al. 2022; docs/reference-behaviour.md, joint-Viterbi).

    Finds the path maximising ``(s_0 + Σ_{intermediate v} s_v + Σ_edges links) / k^β_v`` over
    paths with ``1 ≤ k (≤ max_length)`` intermediate vertices, i.e. the joint optimum of path and
    tokens per length, reranked by length normalisation; every path vertex reads its argmax token.
    As in the reference, the start vertex's best token log-probability ``s_0`` is part of the
    objective (and so divided by ``k^β_v`` with the rest: with ``β_v > 0`` it moves the chosen
    length), the end vertex's is not; both are in ``Hypothesis.score``. Same DP, ``K``,
    fallbacks and 2-vertex rule as :func:`viterbi`.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.
        length_penalty: β_v (``--decode-viterbibeta``), default 1.
        max_length: optional upper bound on ``k``.

    Returns:
        ``B`` hypotheses.

    Raises:
        ValueError: ``max_length < 1``.
    """
    return _viterbi(token_logprobs, links, graph_lengths, True, length_penalty, max_length)


# ----------------------------------------------------------------------------------------------
# Candidate tables, n-gram bans and sampling
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CandidateTable:
    vertex: torch.Tensor  # (B, L, n) int64 destination vertex of each candidate
    token: torch.Tensor  # (B, L, n) int64 its token
    score: torch.Tensor  # (B, L, n) float log weight, descending; −inf = no candidate
    is_end: torch.Tensor  # (B, L, n) bool destination is the end vertex


def _candidate_table(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    top_cand_n: int,
    beta: float,
    temperature: float,
    top_p: float | None,
    end_as_vertex: bool,
) -> _CandidateTable:
    """Top ``top_cand_n`` (vertex, token) pairs per source vertex (docs/reference-behaviour.md,
    sampling and n-gram bans).

    Pair score: ``log_softmax_j(links[i] / τ)[j] + β·log P(y|j)`` for ``y`` among the top
    ``top_cand_n`` tokens of ``j``. With ``end_as_vertex`` the end vertex is a destination like
    any other (the reference's lookahead with bans); without, it is one pair with its argmax
    token, scored by the transition alone (sampling). With ``top_p``, a candidate is dropped
    (score −inf) once the ``exp(score)`` mass ranked before it reaches ``top_p``; the first
    candidate is always kept.
    """
    if top_cand_n < 1:
        raise ValueError(f"top_cand_n must be >= 1, got {top_cand_n}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    token_logprobs, links = _working_dtype(token_logprobs), _working_dtype(links)
    B, L, V = token_logprobs.shape
    device = links.device
    n_tok = min(top_cand_n, V)
    tok_lp, tok_id = token_logprobs.topk(n_tok, dim=2)  # (B, L, n_tok)
    trans = links
    if temperature != 1.0:
        has_row = torch.isfinite(links).any(dim=2, keepdim=True)  # (B, L, 1)
        trans = torch.where(has_row, torch.log_softmax(links / temperature, dim=2), links)
    end = graph_lengths.to(device) - 1  # (B,)
    is_end_v = torch.arange(L, device=device)[None, :] == end[:, None]  # (B, L)
    neg_inf = float("-inf")
    n = min(top_cand_n, L * n_tok)
    scores, flats = [], []
    # The (b, L, L, n_tok) pair scores are built a few sentences at a time to bound memory.
    chunk = max(1, _PAIR_CHUNK_ELEMENTS // (L * L * n_tok))
    for lo in range(0, B, chunk):
        sl = slice(lo, lo + chunk)
        pair = trans[sl, :, :, None] + beta * tok_lp[sl, None, :, :]  # (b, L, L, n_tok)
        if not end_as_vertex:
            # the end vertex's column: one candidate (its argmax token), scored by the transition
            rows = torch.arange(pair.shape[0], device=device)  # (b,)
            end_b = end[sl]  # (b,)
            pair[rows, :, end_b, 1:] = neg_inf
            pair[rows, :, end_b, 0] = trans[sl][rows, :, end_b]  # (b, L) links[i, end]
        sc, fl = pair.reshape(pair.shape[0], L, L * n_tok).topk(n, dim=2)  # (b, L, n)
        scores.append(sc)
        flats.append(fl)
    score, flat = torch.cat(scores), torch.cat(flats)  # (B, L, n)
    vertex = flat // n_tok  # (B, L, n) destination vertex; flat % n_tok is the token's rank
    token = tok_id.reshape(B, L * n_tok).gather(1, flat.reshape(B, -1)).reshape(B, L, n)
    if top_p is not None and top_p < 1.0:
        w = score.exp()  # (B, L, n)
        before = w.cumsum(2) - w  # (B, L, n) mass ranked before each candidate
        score = score.masked_fill(before >= top_p, NEG_INF)
    return _CandidateTable(
        vertex, token, score, is_end_v.gather(1, vertex.reshape(B, -1)).reshape(B, L, n)
    )


def _check_ban_options(consecutive: int, repeated: int) -> None:
    if consecutive < 0 or repeated < 0:
        raise ValueError("n-gram ban orders must be >= 0")


class _BanState:
    """One sentence's token history and its n-gram bans (docs/reference-behaviour.md, n-gram bans).

    Two histories, as the reference's two walks keep them:

    - ``chosen`` (lookahead): every token chosen so far, pads and repeats included, after the
      start vertex's token. The start token counts in the consecutive-repeat comparisons but is
      never banned itself and starts no banned n-gram (in the reference it is held as a tensor,
      which a candidate id never equals as a set member).
    - ``output`` (sampling): the output so far by the rule of :func:`output_tokens` (a token equal
      to the previous vertex's is skipped, pads are dropped).
    """

    def __init__(self, consecutive: int, repeated: int, start: int | None) -> None:
        self.hist: list[int] = [] if start is None else [start]
        self.offset = len(self.hist)  # history entries that are never banned nor in n-grams
        self.raw = start is not None
        self.prev: int | None = None  # the previous intermediate vertex's token (output rule)
        self.consecutive = consecutive
        self.repeated = repeated
        self.seen: set[tuple[int, ...]] = set()

    def banned(self, t: int) -> bool:
        h = self.hist
        if self.consecutive >= 1 and len(h) > self.offset and h[-1] == t:
            return True
        # t would make the last m tokens repeat the m before them
        for m in range(2, min(self.consecutive, (len(h) + 1) // 2) + 1):
            if h[-m] == t and all(h[-k] == h[-m - k] for k in range(1, m)):
                return True
        n = self.repeated
        body = h[self.offset :]
        return n > 0 and len(body) >= n - 1 and (*body[len(body) - n + 1 :], t) in self.seen

    def push(self, t: int) -> None:
        if not self.raw:
            prev, self.prev = self.prev, t
            if t == PAD_ID or t == prev:
                return
        self.hist.append(t)
        n = self.repeated
        if n > 0 and len(self.hist) - self.offset >= n:
            self.seen.add(tuple(self.hist[-n:]))


def _chosen_output(path_tokens: Sequence[int]) -> list[int]:
    """Output of a lookahead walk with bans: the intermediate tokens without pads, repeats kept."""
    return [int(t) for t in list(path_tokens)[1:-1] if t != PAD_ID]


def _candidate_walk(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    table: _CandidateTable,
    sample: bool,
    top_p: float,
    consecutive: int,
    repeated: int,
    rng: np.random.Generator | None,
) -> list[Hypothesis]:
    """Walk the candidate table from vertex 0 to the end, batched over sentences per step.

    Sampling keeps the ``output`` history of :class:`_BanState` and never bans the end vertex;
    lookahead (``sample=False``) keeps the ``chosen`` history, bans end-vertex candidates like
    any other and outputs every chosen intermediate token but pads (:func:`_chosen_output`), as
    the reference does. The walk runs in NumPy on the CPU: each step is a handful of tiny array
    operations, for which torch's per-call overhead would dominate.
    """
    B, L, n = table.score.shape
    vert = table.vertex.cpu().numpy()  # (B, L, n)
    tokt = table.token.cpu().numpy()  # (B, L, n)
    weight = table.score.cpu().to(torch.float64).exp().numpy()  # (B, L, n), 0 = no candidate
    is_end = table.is_end.cpu().numpy()  # (B, L, n)
    end = (graph_lengths.cpu() - 1).numpy().astype(np.int64)  # (B,)
    tok = vertex_top1(_working_dtype(token_logprobs))[1].cpu().numpy()  # (B, L)
    bans = consecutive > 0 or repeated > 0
    states = []
    if bans:
        starts = [None] * B if sample else tok[:, 0].tolist()
        states = [_BanState(consecutive, repeated, start) for start in starts]
    never_banned = is_end if sample else np.zeros_like(is_end)  # (B, L, n)
    rows = np.arange(B)
    cur = np.zeros(B, dtype=np.int64)  # (B,)
    paths, ptoks = [cur.copy()], [tok[:, 0].copy()]
    done = cur == end
    for _ in range(L):
        if done.all():
            break
        w = weight[rows, cur].copy()  # (B, n)
        cand_t, cand_free = tokt[rows, cur], never_banned[rows, cur]  # (B, n), (B, n)
        active = np.flatnonzero(~done).tolist()
        if sample:
            if bans:
                for b in active:
                    for c in range(n):
                        if (
                            w[b, c] > 0
                            and not cand_free[b, c]
                            and states[b].banned(int(cand_t[b, c]))
                        ):
                            w[b, c] = BANNED_WEIGHT
            w[done] = 0.0
            w[done, 0] = 1.0
            cdf = np.cumsum(w, axis=1)  # (B, n)
            u = rng.random(B) * cdf[:, -1]  # (B,)
            choice = np.minimum((cdf <= u[:, None]).sum(1), n - 1)  # (B,) inverse CDF
            # u rounded up to the total could land on a trailing zero weight: never draw it
            choice = np.where(w[rows, choice] > 0, choice, 0)
        else:
            choice = np.zeros(B, dtype=np.int64)
            for b in active:
                skipped = 0.0
                for c in range(n):
                    if w[b, c] <= 0:
                        break  # candidates are sorted: the rest are missing too
                    if cand_free[b, c] or not states[b].banned(int(cand_t[b, c])):
                        choice[b] = c
                        break
                    skipped += w[b, c]
                    if skipped > top_p:
                        break  # too much mass skipped: fall back to the top candidate
        nxt_v = vert[rows, cur, choice]  # (B,)
        nxt_t = tokt[rows, cur, choice]  # (B,)
        if ((nxt_v <= cur) & ~done).any():
            raise ValueError("links has a row without a valid successor before the end vertex")
        if bans:
            for b in active:
                if nxt_v[b] != end[b]:
                    states[b].push(int(nxt_t[b]))
        cur = np.where(done, cur, nxt_v)
        paths.append(cur.copy())
        ptoks.append(np.where(done, ptoks[-1], nxt_t))
        done = cur == end
    device = links.device
    path_t = torch.from_numpy(np.stack(paths, 1)).to(device)  # (B, K)
    tok_t = torch.from_numpy(np.stack(ptoks, 1)).to(device)  # (B, K)
    lengths = (path_t != torch.from_numpy(end).to(device)[:, None]).sum(1) + 1  # (B,)
    return _hypotheses_from_paths(
        _working_dtype(token_logprobs),
        _working_dtype(links),
        path_t,
        tok_t,
        lengths,
        output_tokens if sample else _chosen_output,
    )


def sample(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    *,
    temperature: float = 1.0,
    beta: float = 1.0,
    top_cand_n: int = 5,
    top_p: float = 0.9,
    seed: int | None = None,
    no_consecutive_repeated_ngram: int = 1,
    no_repeated_ngram: int = 0,
) -> list[Hypothesis]:
    """Random walk over (vertex, token) candidates (docs/reference-behaviour.md, sampling).

    At vertex ``i``, candidate pairs ``(j, y)`` are scored
    ``log_softmax_j(links[i] / τ)[j] + β·log P(y|j)`` (``y`` among the top ``top_cand_n`` tokens
    of ``j``); the top ``top_cand_n`` pairs are kept in descending order and truncated once the
    ``exp(score)`` mass ranked before a candidate reaches ``top_p`` (the first always stays).
    Banned candidates get weight :data:`BANNED_WEIGHT` instead of ``exp(score)``; the weights are
    renormalised and one pair is drawn; the walk starts at vertex 0 and stops at the end vertex.

    Bans (on the output so far, see :func:`output_tokens`): ``no_consecutive_repeated_ngram = k``
    bans tokens that would make the last ``m`` output tokens repeat the ``m`` before them for
    ``1 ≤ m ≤ k``; its default 1 bans the previous token, which the reference always does in
    sampling (0 switches it off). ``no_repeated_ngram = n > 0`` bans tokens completing an
    ``n``-gram already in the output.

    Deviation: the end vertex is one candidate whose weight is the transition alone (its token,
    the argmax, is never output), so with ``τ = 1``, ``top_p = 1``, no bans and enough candidates
    a path is drawn with probability exactly ``P(a|x)``.

    The candidate tables are computed batched on the inputs' device; the walk runs on the CPU,
    batched over sentences per step (ban checks loop over sentences). Draws use
    ``numpy.random.default_rng(seed)`` (fresh entropy if ``seed`` is None) and consume one
    uniform per sentence per step, so results are reproducible for a fixed seed and batch, but a
    sentence's draw depends on the batch it is in.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.
        temperature: τ > 0 applied to the transitions.
        beta: β, weight of the token log-probability.
        top_cand_n: candidates per source vertex (≥ 1).
        top_p: nucleus mass in (0, 1]; 1 keeps all candidates.
        seed: RNG seed.
        no_consecutive_repeated_ngram: k ≥ 0.
        no_repeated_ngram: n ≥ 0.

    Returns:
        ``B`` hypotheses (``path_tokens`` are the drawn tokens; the endpoints read their argmax).

    Raises:
        ValueError: τ ≤ 0, ``top_cand_n < 1``, ``top_p`` outside (0, 1] or a negative ban order.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    _check_ban_options(no_consecutive_repeated_ngram, no_repeated_ngram)
    table = _candidate_table(
        token_logprobs,
        links,
        graph_lengths,
        top_cand_n,
        beta,
        temperature,
        top_p,
        end_as_vertex=False,
    )
    rng = np.random.default_rng(seed)
    return _candidate_walk(
        token_logprobs,
        links,
        graph_lengths,
        table,
        sample=True,
        top_p=top_p,
        consecutive=no_consecutive_repeated_ngram,
        repeated=no_repeated_ngram,
        rng=rng,
    )


# ----------------------------------------------------------------------------------------------
# Beam search over output prefixes (thu-coai/DAG-Search; docs/reference-behaviour.md)
# ----------------------------------------------------------------------------------------------


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

    ``Hypothesis.score`` is the score of the single best (path, tokens) inside the chosen output's
    merged states, with the endpoints reading their argmax tokens; ``path``/``path_tokens`` are
    that path.

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
        lm_words: with ``lm``: the LM word of every token id (e.g. the sentencepiece pieces).
        gamma: γ, the LM weight (``--decode-gamma``; used only with ``lm``).

    Returns:
        ``B`` hypotheses.

    Raises:
        ValueError: a non-positive beam/candidate count, ``top_p`` outside (0, 1], or ``lm``
            without ``lm_words``.
        ImportError: ``lm`` given but ``kenlm`` is not installed.
    """
    if beam_size < 1 or max_beam_per_length < 1 or top_cand_n < 1:
        raise ValueError("beam_size, max_beam_per_length and top_cand_n must be >= 1")
    if max_successors is not None and max_successors < 1:
        raise ValueError(f"max_successors must be >= 1, got {max_successors}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
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
    """
    L, V = lp.shape
    n = min(top_cand_n, V)
    top_tok = np.argsort(-lp, axis=1, kind="stable")[:, :n]  # (L, n)
    top_lp = np.take_along_axis(lp, top_tok, axis=1)  # (L, n)
    argmax_tok = lp.argmax(axis=1)  # (L,)
    if L == 2:
        path, ptoks = [0, 1], [int(argmax_tok[0]), int(argmax_tok[1])]
        return Hypothesis([], path, ptoks, path_score(lp, ln, path, ptoks))
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
        h, free, length, last, lse, best = state[:6]
        rank = lse / np.maximum(length, 1) ** alpha  # (G,)
        order = np.lexsort((-rank, length))  # by length, best rank first within a length
        len_s = length[order]
        starts = np.flatnonzero(np.r_[True, len_s[1:] != len_s[:-1]])
        counts = np.diff(np.r_[starts, len(order)])
        within = np.arange(len(order)) - np.repeat(starts, counts)
        survivors = order[within < max_beam_per_length]
        kept = survivors[np.argsort(-rank[survivors], kind="stable")[:beam_size]]  # (S,)
        cands = _beam_candidates(ln[i], top_lp, top_tok, i, top_p, max_successors)
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
            np.broadcast_to(ids[kept, None], (S, C)),
            np.broadcast_to(ct[None, :], (S, C)),
        )
        for j in np.unique(cj).tolist():
            cols = cj == j
            pending[j].append(tuple(f[:, cols].reshape(-1) for f in fields))
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
    """
    L, V = lp.shape
    n = min(top_cand_n, V)
    top_tok = np.argsort(-lp, axis=1, kind="stable")[:, :n]  # (L, n)
    top_lp = np.take_along_axis(lp, top_tok, axis=1)  # (L, n)
    argmax_tok = lp.argmax(axis=1)  # (L,)
    if L == 2:
        path, ptoks = [0, 1], [int(argmax_tok[0]), int(argmax_tok[1])]
        return Hypothesis([], path, ptoks, path_score(lp, ln, path, ptoks))

    # Trie of output prefixes: node -> (parent, last token, length, lm score, lm state).
    node_parent, node_tok, node_len, node_lm = [-1], [-1], [0], [0.0]
    node_state = [lm.begin() if lm is not None else None]
    children: dict[tuple[int, int], int] = {}

    def child(node: int, t: int) -> int:
        c = children.get((node, t))
        if c is None:
            c = len(node_tok)
            children[(node, t)] = c
            node_parent.append(node)
            node_tok.append(t)
            node_len.append(node_len[node] + 1)
            if lm is not None:
                s, st = lm.step(node_state[node], t)
                node_lm.append(node_lm[node] + s)
                node_state.append(st)
            else:
                node_lm.append(0.0)
                node_state.append(None)
        return c

    # Entry: [log-sum-exp score, best single score, back-pointer entry, token, vertex, node, free]
    states: list[dict[tuple[int, bool], list]] = [dict() for _ in range(L)]
    states[0][(0, True)] = [0.0, 0.0, None, int(argmax_tok[0]), 0, 0, True]
    end = L - 1

    def rank(entry: list, final: bool = False) -> float:
        node = entry[5]
        lm_score = node_lm[node]
        if final and lm is not None:
            lm_score += lm.finish(node_state[node])
        return (entry[0] + gamma * lm_score) / (max(1, node_len[node]) ** alpha)

    for i in range(L - 1):
        if not states[i]:
            continue
        entries = sorted(states[i].values(), key=rank, reverse=True)
        states[i] = {}
        per_len: dict[int, int] = {}
        kept = []
        for e in entries:
            k = node_len[e[5]]
            if per_len.get(k, 0) < max_beam_per_length:
                per_len[k] = per_len.get(k, 0) + 1
                kept.append(e)
                if len(kept) == beam_size:
                    break
        cands = _beam_candidates(ln[i], top_lp, top_tok, i, top_p, max_successors)
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
                    key = (child(node, t) if c is None else c, False)
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
    if not states[end]:
        raise ValueError("links has no path from vertex 0 to the end vertex")
    final = max(states[end].values(), key=lambda e: rank(e, final=True))
    path, ptoks = [], []
    e = final
    while e is not None:
        path.append(e[4])
        ptoks.append(e[3] if e[3] >= 0 else int(argmax_tok[e[4]]))
        e = e[2]
    path.reverse()
    ptoks.reverse()
    ptoks[-1] = int(argmax_tok[end])
    tokens, node = [], final[5]
    while node != 0:  # the chosen output, read off the trie (equals output_tokens(ptoks))
        tokens.append(node_tok[node])
        node = node_parent[node]
    tokens.reverse()
    return Hypothesis(tokens, path, ptoks, path_score(lp, ln, path, ptoks))


# ----------------------------------------------------------------------------------------------
# Registry and dispatcher
# ----------------------------------------------------------------------------------------------

#: Strategy name → decoder ``fn(token_logprobs, links, graph_lengths, **options)``.
STRATEGIES: dict[str, Callable[..., list[Hypothesis]]] = {
    "greedy": greedy,
    "lookahead": lookahead,
    "viterbi": viterbi,
    "joint-viterbi": joint_viterbi,
    "sample": sample,
    "beam": beam_search,
}


def decode(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    strategy: str,
    **options: Any,
) -> list[Hypothesis]:
    """Decode a batch of DAGs with one of :data:`STRATEGIES`.

    Args:
        token_logprobs: ``(B, L, V)`` float log P(token|vertex), or their :class:`VertexTop1`
            for the strategies of :data:`TOP1_STRATEGIES` (lookahead without n-gram bans).
        links: ``(B, L, L)`` float log E (see the module docstring for the layout).
        graph_lengths: ``(B,)`` int64 graph sizes, each in ``[2, L]``.
        strategy: ``greedy``, ``lookahead``, ``viterbi``, ``joint-viterbi``, ``sample`` or ``beam``.
        **options: the chosen decoder's keyword options.

    Returns:
        One :class:`Hypothesis` per sentence.

    Raises:
        ValueError: unknown strategy or option, bad option value, or inconsistent shapes.
    """
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise ValueError(f"unknown decoding strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    accepted = [
        p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for strategy {strategy!r}; "
            f"accepted: {', '.join(accepted) or 'none'}"
        )
    if isinstance(token_logprobs, VertexTop1) and (
        strategy not in TOP1_STRATEGIES
        or any(options.get(k) for k in ("no_consecutive_repeated_ngram", "no_repeated_ngram"))
    ):
        raise ValueError(
            f"strategy {strategy!r} with these options reads more of the token head than "
            "VertexTop1 holds; pass the (B, L, V) token log-probabilities"
        )
    _check_inputs(token_logprobs, links, graph_lengths)
    with torch.no_grad():
        return fn(token_logprobs, links, graph_lengths, **options)
