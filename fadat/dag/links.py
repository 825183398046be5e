"""Transitions and passing probabilities of a DAG (paper Eq. 16): ``E = exp(links)`` on the
valid triangle and ``p = e₀ᵀ (I − E)⁻¹``, each with its own backward. Conventions:
:mod:`fadat.dag`.
"""

from __future__ import annotations

import torch

from fadat.dag._shared import _check_lengths, _flushed_exp, _valid_links


class _TransitionsFn(torch.autograd.Function):
    """E = exp(links) on the valid triangle, exact 0 elsewhere and where flushed; dE/dlinks = E."""

    @staticmethod
    def forward(ctx, links, graph_lengths):
        trans = _flushed_exp(links, _valid_links(graph_lengths, links.shape[1]))  # (B, L, L)
        ctx.save_for_backward(trans)
        return trans

    @staticmethod
    def backward(ctx, grad_trans):
        (trans,) = ctx.saved_tensors
        # 0 off the triangle and where E was flushed: the subgradient of the flushed exp.
        return grad_trans * trans, None


def _transitions(links: torch.Tensor, graph_lengths: torch.Tensor) -> torch.Tensor:
    """(B, L, L) transition probabilities E, exact zeros outside the valid triangle (and below
    the float's normal range, :func:`_flushed_exp`); differentiable w.r.t. ``links``."""
    if links.dim() != 3 or links.shape[1] != links.shape[2]:
        raise ValueError(f"links must be (B, L, L), got {tuple(links.shape)}")
    _check_lengths(graph_lengths, links.shape[1], "graph_lengths")
    return _TransitionsFn.apply(links, graph_lengths)  # (B, L, L)


class _PassingFn(torch.autograd.Function):
    """p = e₀ᵀ (I − E)⁻¹ by one unit-triangular solve; backward by one more solve.

    With A = I − E: dL/dE[i, j] = p_i q_j where A q = ∂L/∂p. The outer product is returned for
    every (i, j); entries off the strict upper triangle are multiplied by E = 0 downstream
    (:class:`_TransitionsFn`), so they never reach ``links``.
    """

    @staticmethod
    def forward(ctx, trans):
        batch, size, _ = trans.shape
        neg = trans.neg()  # (B, L, L): the strict upper triangle of A = I − E
        e0 = torch.zeros(batch, 1, size, dtype=trans.dtype, device=trans.device)  # (B, 1, L)
        e0[:, 0, 0] = 1.0
        # unitriangular=True reads only the strict upper triangle: p A = e₀ is one blocked
        # triangular solve per sentence (LAPACK trsm on CPU).
        p = torch.linalg.solve_triangular(neg, e0, upper=True, left=False, unitriangular=True)
        ctx.save_for_backward(neg, p)
        return p.squeeze(1)  # (B, L)

    @staticmethod
    def backward(ctx, grad_p):
        neg, p = ctx.saved_tensors  # (B, L, L), (B, 1, L)
        q = torch.linalg.solve_triangular(
            neg, grad_p.unsqueeze(2), upper=True, left=True, unitriangular=True
        )  # (B, L, 1)
        return torch.bmm(p.transpose(1, 2), q.transpose(1, 2))  # (B, L, L): p_i q_j


def _passing_from_transitions(trans: torch.Tensor) -> torch.Tensor:
    """Passing probabilities p = e₀ᵀ (I − E)⁻¹ (B, L) from (B, L, L) strictly upper-triangular
    E (from :func:`_transitions`)."""
    return _PassingFn.apply(trans)


# --------------------------------------------------------------------------------------------
# 1. Passing probabilities (Eq. 16)
# --------------------------------------------------------------------------------------------


def passing_probabilities(links: torch.Tensor, graph_lengths: torch.Tensor) -> torch.Tensor:
    """Probability that each vertex lies on a random path of the DAG (paper Eq. 16).

    ``p_0 = 1`` and ``p_v = Σ_{u<v} p_u E[u, v]``, computed as the unit-triangular solve ``p = e₀ᵀ
    (I − E)⁻¹`` instead of the reference's O(L) Python loop (docs/reference-behaviour.md, "Fuzzy
    alignment loss", "Passing probability"). Differentiable: the backward is one more triangular
    solve and an outer product (``_PassingFn``). Transition probabilities below ~2e−38 in float32
    count as 0.

    Args:
        links: ``(B, L, L)`` float32/float64, ``log E[i, j]`` (entries outside ``i < j < L_b``
            are ignored).
        graph_lengths: ``(B,)`` int64, ``1 ≤ L_b ≤ L``.

    Returns:
        ``(B, L)`` same dtype as ``links``: passing probabilities; 1 at vertex 0 and at vertex
        ``L_b − 1`` (every path ends there), 0 at padding vertices ``v ≥ L_b``.

    Raises:
        ValueError: bad shapes or lengths outside ``[1, L]``.

    Device-agnostic; run on CPU only (CUDA was not run here).
    """
    return _passing_from_transitions(_transitions(links, graph_lengths))
