"""Viterbi and joint-Viterbi decoding (Shao et al. 2022; docs/reference-behaviour.md): the best
path of each length by dynamic programming, chosen with a length penalty (Viterbi) or jointly
over paths and tokens (joint-Viterbi). Conventions: :mod:`fadat.decoding`.
"""

from __future__ import annotations

import torch

from fadat.decoding.paths import (
    NEG_INF,
    Hypothesis,
    hypotheses_from_paths,
    vertex_top1,
    working_dtype,
)


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
    token_logprobs, links = working_dtype(token_logprobs), working_dtype(links)
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
    return hypotheses_from_paths(token_logprobs, links, padded, tok.gather(1, padded), lengths)


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
