"""The best alignment of a reference on a DAG: the Viterbi of the likelihood's dynamic programme
(paper §2; docs/reference-behaviour.md, "DAG likelihood"). Conventions: :mod:`fadat.dag`.
"""

from __future__ import annotations

import torch

from fadat.dag._shared import (
    _NEG_INF,
    _check_lengths,
    _chunks,
    _map_chunks,
    _serial_on_cpu,
    _use_triton,
    _valid_links,
)
from fadat.dag.likelihood import gather_match

# --------------------------------------------------------------------------------------------
# 3. Best alignment (Viterbi of the §2 DP)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def best_alignment_from_match(
    match: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Most probable path for the reference, from ``match`` (docs/reference-behaviour.md, "Glancing"
    step 2).

    Max-product version of the §2 DP in log space: the forward keeps values only
    (``amax`` per step, much cheaper than ``max`` with indices on CPU); the arg-max is recomputed
    for one column per step while backtracking. Ties go to the lowest vertex index.

    Args:
        match: ``(B, T, L)`` float log-probabilities.
        links: ``(B, L, L)`` float, ``log E``.
        graph_lengths: ``(B,)`` int64 ``L_b``.
        target_lengths: ``(B,)`` int64 ``T_b``.
        backend: ``"auto"`` (the Triton Viterbi kernel of :mod:`fadat.kernels.triton_dag` for
            float32 CUDA tensors when ``triton`` is importable and ``AUTO_USES_TRITON`` is set,
            else this PyTorch path),
            ``"torch"`` or ``"triton"`` (forced; on CPU tensors only under
            ``TRITON_INTERPRET=1``).

    Returns:
        ``(B, L)`` int64: the target index aligned to each vertex on the best path, −1 for
        vertices off the path; a row of −1 where no path exists (``T_b > L_b``). Not
        differentiable (glancing uses it as an oracle).

    Raises:
        ValueError: bad shapes or lengths out of range.

    Device-agnostic; run on CPU only (CUDA was not run here).
    """
    batch, steps, size = match.shape
    _check_lengths(target_lengths, steps, "target_lengths")
    if links.shape != (batch, size, size):
        raise ValueError(f"links {tuple(links.shape)} does not match match {tuple(match.shape)}")
    _check_lengths(graph_lengths, size, "graph_lengths")
    glen, tlen = graph_lengths.long(), target_lengths.long()
    if _use_triton(match, backend):
        from fadat.kernels import triton_dag

        return triton_dag.best_alignment(match, links.to(match.dtype), glen, tlen)
    # Masked links in a destination-major copy (one pass), so that each step reduces over the
    # contiguous last dimension.
    to_from = torch.empty(batch, size, size, dtype=match.dtype, device=match.device)
    valid_t = _valid_links(glen, size).transpose(1, 2)  # (B, L_j, L_i)
    neg_inf = torch.full((), _NEG_INF, dtype=match.dtype, device=match.device)
    torch.where(valid_t, links.transpose(1, 2).to(match.dtype), neg_inf, out=to_from)
    alpha = torch.full_like(match, _NEG_INF)  # (B, T, L)
    alpha[:, 0, 0] = match[:, 0, 0]

    def forward(c: slice) -> None:
        # Cache-sized chunks keep the (c, L, L) temporary of every step in cache on CPU;
        # one reused buffer avoids a fresh allocation per step.
        block, part = to_from[c], alpha[c]  # (c, L, L), (c, T, L) view
        scratch = torch.empty_like(block)  # (c, L, L)
        for t in range(1, steps):
            torch.add(part[:, t - 1, None, :], block, out=scratch)
            part[:, t] = scratch.amax(-1) + match[c, t]

    with _serial_on_cpu(to_from) as workers:
        _map_chunks(forward, _chunks(batch, size, to_from, workers), workers)
    rows = torch.arange(batch, device=match.device)
    ok = (tlen <= glen) & torch.isfinite(alpha[rows, tlen - 1, glen - 1])  # (B,)
    path = torch.full((batch, size), -1, dtype=torch.int64, device=match.device)  # (B, L)
    cur = glen - 1  # (B,)
    for t in range(steps - 1, -1, -1):
        active = ok & (t <= tlen - 1)  # (B,)
        cur = torch.where(t == tlen - 1, glen - 1, cur)
        path[rows[active], cur[active]] = t
        if t > 0:
            column = to_from[rows, cur]  # (B, L_i)
            prev = (alpha[:, t - 1] + column).argmax(-1)  # (B,)
            cur = torch.where(active, prev, cur)
    return path


def best_alignment(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Most probable path's target index for each vertex (used by glancing,
    docs/reference-behaviour.md, "Glancing").

    ``best_alignment_from_match(gather_match(token_logprobs, targets), ...)``.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        links: ``(B, L, L)`` float, ``log E``.
        targets: ``(B, T)`` int64.
        graph_lengths: ``(B,)`` int64 ``L_b``.
        target_lengths: ``(B,)`` int64 ``T_b``.
        backend: ``"auto"``, ``"torch"`` or ``"triton"`` (see :func:`best_alignment_from_match`).

    Returns:
        ``(B, L)`` int64: target index per vertex on the best path, −1 off the path (all −1
        where ``T_b > L_b``). Exactly ``T_b`` vertices are aligned: 0 ↦ 0, ``L_b − 1 ↦ T_b − 1``.

    Raises:
        ValueError: bad shapes, lengths or target ids.

    Device-agnostic; run on CPU only (CUDA was not run here).
    """
    with torch.no_grad():
        match = gather_match(token_logprobs, targets)  # (B, T, L)
    return best_alignment_from_match(match, links, graph_lengths, target_lengths, backend=backend)
