"""Brute force over the paths of a DAG, shared by the tests of the DAG math, the losses, the
decoders and the analysis: every path is enumerated, so these are slow and written for clarity
(docs/reference-behaviour.md, "DAG likelihood")."""

from __future__ import annotations

import itertools
import math

import torch

NEG_INF = float("-inf")


def paths_with(size: int, count: int) -> list[tuple[int, ...]]:
    """All paths ``0 = a_1 < … < a_count = size − 1`` of ``count`` vertices."""
    if count == 1:
        return [(0,)] if size == 1 else []
    if size < 2 or count < 1:
        return []
    return [(0, *mid, size - 1) for mid in itertools.combinations(range(1, size - 1), count - 2)]


def all_paths(size: int) -> list[tuple[int, ...]]:
    """Every path from vertex 0 to vertex ``size − 1`` with increasing vertices."""
    return [p for k in range(1, size + 1) for p in paths_with(size, k)]


def path_logprob(links: torch.Tensor, path) -> torch.Tensor:
    """``Σ_k links[a_k, a_{k+1}]``: the log-probability of ``path`` under ``(L, L)`` links."""
    total = links.new_zeros(())
    for i, j in itertools.pairwise(path):
        total = total + links[i, j]
    return total


def path_prob(links: torch.Tensor, path) -> float:
    """``exp(path_logprob)`` as a Python float."""
    return math.exp(float(path_logprob(links, path)))


def log_likelihood(token_logprobs, links, target, size, forbid=None) -> torch.Tensor:
    """``log P(y|x) = log Σ_a P(a|x) Π_t P(y_t | a_t)`` over the paths of ``len(target)``
    vertices of a graph of ``size`` vertices (``token_logprobs`` ``(L, V)``, ``links``
    ``(L, L)``); ``forbid``: ``{(t, vertex)}`` pairs a path may not use (force-emit). −inf when
    no path is left."""
    terms = []
    for path in paths_with(size, len(target)):
        if forbid and any((t, v) in forbid for t, v in enumerate(path)):
            continue
        emit = sum(token_logprobs[v, target[t]] for t, v in enumerate(path))
        terms.append(path_logprob(links, path) + emit)
    return torch.logsumexp(torch.stack(terms), 0) if terms else links.new_tensor(NEG_INF)


def passing(links: torch.Tensor, size: int) -> torch.Tensor:
    """``(size,)``: the probability that a path passes through each vertex."""
    p = [links.new_zeros(()) for _ in range(size)]
    for path in all_paths(size):
        prob = path_logprob(links, path).exp()
        for v in path:
            p[v] = p[v] + prob
    return torch.stack(p)
