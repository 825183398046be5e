"""FA-DAT's fuzzy alignment (paper Eq. 11, 16–20, Algorithm 1): expected n-gram counts of the
DAG's outputs against the reference's n-grams, clipped precision and brevity penalty.
Conventions: :mod:`fadat.dag`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fadat.dag._shared import _check_lengths, _serial_on_cpu
from fadat.dag.links import _passing_from_transitions, _transitions

# --------------------------------------------------------------------------------------------
# 4. Fuzzy alignment (Eq. 11, 16–20, Algorithm 1)
# --------------------------------------------------------------------------------------------


class FuzzyAlignment(NamedTuple):
    """Per-sentence quantities of FA-DAT's fuzzy alignment (all ``(B,)``, differentiable).

    Attributes:
        expected_length: ``E|A| = Σ_v p_v`` (expected number of vertices on a path).
        expected_ngrams: ``‖pᵀ E^{n−1}‖₁`` (Eq. 17), expected number of n-grams of an output.
        clipped_matches: ``Σ_g min(E[C_g(y')], C_g(y))`` with ``E[C_g]`` from Eq. 18.
        precision: ``p′_n`` (Eq. 11) = clipped_matches / expected_ngrams; 0 where the graph
            cannot hold an n-gram.
        brevity_penalty: ``min(1, exp(1 − T_b / E|A|))`` (Eq. 19).
        score: ``brevity_penalty × precision``; the FA-DAT loss (Eq. 20) is ``−score.mean()``.
    """

    expected_length: torch.Tensor
    expected_ngrams: torch.Tensor
    clipped_matches: torch.Tensor
    precision: torch.Tensor
    brevity_penalty: torch.Tensor
    score: torch.Tensor


def reference_ngrams(
    targets: torch.Tensor, target_lengths: torch.Tensor, order: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct n-grams of each reference and their counts, with tensor ops
    (docs/reference-behaviour.md, "Fuzzy alignment loss").

    Windows of ``targets[b, :T_b]`` (``<s>``/``</s>`` included) are packed into one int64 key
    per (sentence, n-gram) when that fits (else rows are compared with ``unique(dim=0)``),
    de-duplicated by one ``torch.unique``, and scattered back into a padded table.

    Args:
        targets: ``(B, T)`` int64 token ids (ids ≥ 0 within ``T_b``).
        target_lengths: ``(B,)`` int64 ``T_b``.
        order: n ≥ 1.

    Returns:
        ``grams`` ``(B, N, n)`` int64 (padding rows are 0) and ``counts`` ``(B, N)`` int64
        (0 marks padding), ``N`` = the largest number of distinct n-grams in a sentence (≥ 1).

    Raises:
        ValueError: ``order < 1``.
    """
    if order < 1:
        raise ValueError(f"n-gram order must be >= 1, got {order}")
    # Tiny index ops: OpenMP fork/join would cost more than the work (see _serial_on_cpu).
    with _serial_on_cpu(targets):  # (one worker: no chunks here)
        return _reference_ngrams(targets, target_lengths, order)


def _reference_ngrams(
    targets: torch.Tensor, target_lengths: torch.Tensor, order: int
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, steps = targets.shape
    device = targets.device
    if steps < order:
        return (
            torch.zeros(batch, 1, order, dtype=torch.int64, device=device),
            torch.zeros(batch, 1, dtype=torch.int64, device=device),
        )
    windows = targets.clamp(min=0).unfold(1, order, 1)  # (B, W, n)
    n_win = windows.shape[1]
    keep = torch.arange(n_win, device=device)[None, :] + order <= target_lengths[:, None]
    sent = torch.arange(batch, device=device)[:, None].expand(batch, n_win)[keep]  # (K,)
    flat = windows[keep]  # (K, n)
    base = int(targets.max()) + 1 if targets.numel() else 1
    if flat.shape[0] == 0:
        return (
            torch.zeros(batch, 1, order, dtype=torch.int64, device=device),
            torch.zeros(batch, 1, dtype=torch.int64, device=device),
        )
    if math.log2(max(batch, 1)) + order * math.log2(max(base, 2)) < 62:
        key = sent.clone()
        for i in range(order):
            key = key * base + flat[:, i]
        uniq, counts = torch.unique(key, return_counts=True)  # sorted: sentence-major
        u_sent = uniq.clone()
        digits = []
        for _ in range(order):
            digits.append(u_sent % base)
            u_sent = u_sent // base
        u_grams = torch.stack(digits[::-1], dim=1)  # (U, n)
    else:
        rows, counts = torch.unique(torch.cat([sent[:, None], flat], 1), dim=0, return_counts=True)
        u_sent, u_grams = rows[:, 0], rows[:, 1:]
    per_sent = torch.bincount(u_sent, minlength=batch)  # (B,)
    width = max(int(per_sent.max()), 1)
    start = torch.cumsum(per_sent, 0) - per_sent  # (B,)
    slot = torch.arange(u_sent.shape[0], device=device) - start[u_sent]  # (U,)
    grams = torch.zeros(batch, width, order, dtype=torch.int64, device=device)
    table = torch.zeros(batch, width, dtype=torch.int64, device=device)
    grams[u_sent, slot] = u_grams
    table[u_sent, slot] = counts
    return grams, table


def fuzzy_alignment(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    order: int = 2,
) -> FuzzyAlignment:
    """FA-DAT's fuzzy n-gram alignment between the DAG and the reference (paper §3).

    Algorithm 1 with the passing probabilities of Eq. 16 from a triangular solve; the expected
    n-gram counts of Eq. 18 as ``(p ⊙ G_1) E ⊙ G_2 … E ⊙ G_n`` for all distinct reference n-grams at
    once (one (B, N, L)×(B, L, L) matmul per order); the token probabilities are gathered only for
    the reference n-grams' tokens, never via a (B, N, L, V) expansion (docs/reference-behaviour.md,
    "Fuzzy alignment loss"). Follows the reference code where the paper is silent: a single order n,
    ``<s>``/``</s>`` inside n-grams and in both lengths, ``T_b`` from ``target_lengths``,
    probabilities in the input dtype (float32 in training, not fp16); transition probabilities below
    the normal range (≈ 2e−38 in float32) are flushed to 0.

    Args:
        token_logprobs: ``(B, L, V)`` float32/float64, ``log P(token | vertex)``.
        links: ``(B, L, L)`` float, ``log E``.
        targets: ``(B, T)`` int64 (``<s> y </s>`` in training).
        graph_lengths: ``(B,)`` int64 ``L_b``.
        target_lengths: ``(B,)`` int64 ``T_b``.
        order: n ≥ 1.

    Returns:
        :class:`FuzzyAlignment` of ``(B,)`` tensors in the promoted dtype. A graph too short to
        hold an n-gram (or a reference shorter than n) gets precision 0 and score 0 with finite
        gradients.

    Raises:
        ValueError: bad shapes, lengths, target ids or ``order < 1``.

    Device-agnostic; run on CPU only (CUDA was not run here).
    """
    if token_logprobs.dim() != 3 or token_logprobs.shape[:2] != links.shape[:2]:
        raise ValueError(
            f"token_logprobs {tuple(token_logprobs.shape)} and links {tuple(links.shape)} differ"
        )
    _check_lengths(target_lengths, targets.shape[1], "target_lengths")
    batch, size, vocab = token_logprobs.shape
    if targets.numel() and int(targets.max()) >= vocab:
        raise ValueError(f"target id {int(targets.max())} out of range for V = {vocab}")
    dtype = torch.promote_types(token_logprobs.dtype, links.dtype)
    trans = _transitions(links.to(dtype), graph_lengths.long())  # (B, L, L)
    passing = _passing_from_transitions(trans)  # (B, L)
    expected_length = passing.sum(-1)  # (B,)
    hop = passing.unsqueeze(1)  # (B, 1, L)
    for _ in range(order - 1):
        hop = torch.bmm(hop, trans)  # (B, 1, L)
    expected_ngrams = hop.sum((1, 2))  # (B,)

    grams, counts = reference_ngrams(targets, target_lengths.long(), order)  # (B, N, n), (B, N)
    width = grams.shape[1]
    index = grams.reshape(batch, 1, width * order).expand(batch, size, width * order)
    probs = token_logprobs.to(dtype).gather(2, index).exp()  # (B, L, N·n)
    probs = probs.view(batch, size, width, order).permute(3, 0, 2, 1)  # (n, B, N, L)
    mass = passing.unsqueeze(1) * probs[0]  # (B, N, L)
    for i in range(1, order):
        mass = torch.bmm(mass, trans) * probs[i]  # (B, N, L)
    expected_counts = mass.sum(-1)  # (B, N)
    ref = counts.to(dtype)  # (B, N)
    clipped = (torch.minimum(expected_counts, ref) * (counts > 0)).sum(-1)  # (B,)
    has = expected_ngrams > 0
    precision = torch.where(has, clipped / torch.where(has, expected_ngrams, 1.0), 0.0)
    ratio = target_lengths.to(dtype) / expected_length  # (B,); E|A| ≥ p_0 = 1
    brevity = torch.clamp((1.0 - ratio).exp(), max=1.0)  # (B,)
    return FuzzyAlignment(
        expected_length=expected_length,
        expected_ngrams=expected_ngrams,
        clipped_matches=clipped,
        precision=precision,
        brevity_penalty=brevity,
        score=brevity * precision,
    )
