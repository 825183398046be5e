"""Greedy and lookahead decoding (paper Eq. 21-22): walk the graph from vertex 0, at each step
taking the best next vertex by its link (greedy) or by link plus the next vertex's best token
(lookahead); lookahead with n-gram bans walks the candidate tables of :mod:`.sampling`.
Conventions: :mod:`fadat.decoding`.
"""

from __future__ import annotations

import torch

from fadat.decoding.paths import Hypothesis, hypotheses_from_paths, vertex_top1, working_dtype
from fadat.decoding.sampling import candidate_table, candidate_walk, check_ban_options


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
    return _walk(working_dtype(links).argmax(dim=2), graph_lengths)


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
    token_logprobs, links = working_dtype(token_logprobs), working_dtype(links)
    s, tok = vertex_top1(token_logprobs)  # (B, L), (B, L)
    # β = 0 reads no s (and 0·(−inf) of a pruned vertex would be NaN, fadat.inference)
    scores = links if not beta else links + beta * s[:, None, :]  # (B, L, L)
    next_vertex = scores.argmax(dim=2)  # (B, L)
    paths, lengths = _walk(next_vertex, graph_lengths)  # (B, K), (B,)
    path_tokens = tok.gather(1, paths)  # (B, K)
    return hypotheses_from_paths(token_logprobs, links, paths, path_tokens, lengths)


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
    check_ban_options(no_consecutive_repeated_ngram, no_repeated_ngram)
    if no_consecutive_repeated_ngram == 0 and no_repeated_ngram == 0:
        return _lookahead_like(token_logprobs, links, graph_lengths, beta=beta)
    table = candidate_table(
        token_logprobs, links, graph_lengths, top_cand_n, beta, 1.0, None, end_as_vertex=True
    )
    return candidate_walk(
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
