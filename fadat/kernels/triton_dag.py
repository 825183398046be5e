"""Triton kernels for the DAG likelihood (forward and backward) and the best alignment.

The same dynamic programmes as :mod:`fadat.dag` (paper Eq. 3; docs/reference-behaviour.md, "DAG
likelihood" and "Glancing" step 2), in float32 log space over target positions:

- forward: ``f_0 = match[0, 0]`` at vertex 0, ``f_t[j] = logsumexp_{i<j}(f_{t−1}[i] + links[i,
  j]) + match[t, j]``, ``log P = f_{T_b−1}[L_b−1]``;
- backward: ``g_{T_b−1} = 0`` at vertex ``L_b − 1``, ``g_{t−1}[i] = logsumexp_{j>i}(links[i, j] +
  match[t, j] + g_t[j])``; the posteriors ``∂ log P / ∂ match[t, j] = exp(f_t[j] + g_t[j] − log
  P)`` and ``∂ log P / ∂ links[i, j] = Σ_t exp(f_{t−1}[i] + links[i, j] + match[t, j] + g_t[j] −
  log P)``;
- best alignment: the forward with ``max`` in place of ``logsumexp`` and a back-pointer per
  ``(t, j)`` (ties to the lowest vertex, as :func:`fadat.dag.best_alignment_from_match`), then
  the walk back from ``(T_b − 1, L_b − 1)``.

One program per sentence runs the sequential recursions (each target step is a sweep over
``(BLOCK, BLOCK)`` tiles of the link matrix with an online logsumexp, and a block barrier between
steps); the link gradient is one program per ``(sentence, tile)`` summing over the steps. Log
space needs no rescaling and no float64 recomputation (:func:`fadat.dag.dag_log_likelihood`'s
exp-space path needs both on CPU, where matvecs are what is fast).

Selection (:func:`use_triton`): ``backend="auto"`` picks these kernels for float32 CUDA tensors
when ``triton`` is importable and :data:`AUTO_USES_TRITON` is true (it is: ``tests/test_cuda.py``
passed on an H100, where the kernels computed the likelihood 2–7× and the best alignment 3–19×
faster than the PyTorch DPs, docs/results/gpu.md), else the PyTorch path; ``"triton"`` forces
them (on CPU tensors only under Triton's interpreter, ``TRITON_INTERPRET=1``, which is how CI
tests them); ``"torch"`` forces the PyTorch path.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import ModuleType

import torch

__all__ = [
    "AUTO_USES_TRITON",
    "BACKENDS",
    "BLOCK",
    "NUM_WARPS",
    "best_alignment",
    "log_likelihood",
    "use_triton",
]

#: The values of the ``backend`` argument of :mod:`fadat.dag`'s likelihood and alignment.
BACKENDS = ("auto", "torch", "triton")

#: Tile edge (vertices) of the link matrix processed at once; a fixed launch configuration (no
#: autotuning), so that the interpreter tests run exactly what a GPU runs.
BLOCK = 32
NUM_WARPS = 4

#: Whether ``backend="auto"`` selects these kernels on float32 CUDA tensors. True since
#: ``tests/test_cuda.py`` passed on an H100 (torch 2.11, CUDA 13.0; docs/results/gpu.md): there
#: they agree with the float64 PyTorch DPs within float32 rounding and a ``base`` training step at
#: λ = 8 ran 1.4× faster with them. ``fadat train --dag-backend torch`` opts out.
AUTO_USES_TRITON = True

_NEG_INF = float("-inf")


@functools.cache
def triton_importable() -> bool:
    """Whether the ``triton`` package is installed (cached). Does not import it: Triton fixes
    compiler-or-interpreter for the whole process when it is first imported."""
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def use_triton(tensor: torch.Tensor, backend: str) -> bool:
    """Whether the DAG programmes on ``tensor`` run in these kernels.

    Args:
        tensor: the ``match`` (or ``links``) tensor of the call.
        backend: one of :data:`BACKENDS`.

    Returns:
        ``"auto"``: True for float32 CUDA tensors when ``triton`` is importable and
        :data:`AUTO_USES_TRITON` is true; ``"torch"``: False; ``"triton"``: True (or an error).

    Raises:
        ValueError: an unknown backend; ``"triton"`` without the package, on a dtype other than
            float32, or on CPU tensors outside Triton's interpreter.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return False
    if backend == "auto":
        return (
            AUTO_USES_TRITON
            and tensor.is_cuda
            and tensor.dtype == torch.float32
            and triton_importable()
        )
    if not triton_importable():
        raise ValueError("backend='triton' needs the triton package (pip install triton)")
    if tensor.dtype != torch.float32:
        raise ValueError(f"the Triton DAG kernels run in float32, got {tensor.dtype}")
    if not tensor.is_cuda and not _interpreting():
        raise ValueError(
            "backend='triton' on CPU tensors runs only under Triton's interpreter "
            "(TRITON_INTERPRET=1 set before triton is imported); use a CUDA tensor or "
            "backend='torch'"
        )
    return True


def _kernels() -> ModuleType:
    """The kernel module, imported on first use, so that importing this module imports no
    Triton: whether the kernels compile or run in the interpreter is fixed by
    ``TRITON_INTERPRET`` when ``triton`` is first imported in the process."""
    from fadat.kernels import _triton_dag_jit

    return _triton_dag_jit


def _inputs(
    match: torch.Tensor, links: torch.Tensor, graph_lengths: torch.Tensor, target_lengths
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        match.contiguous(),
        links.contiguous(),
        graph_lengths.long().contiguous(),
        target_lengths.long().contiguous(),
    )


class _LikelihoodFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, match, links, graph_lengths, target_lengths):
        match, links, glen, tlen = _inputs(match, links, graph_lengths, target_lengths)
        batch, steps, size = match.shape
        alpha = torch.full_like(match, _NEG_INF)  # (B, T, L)
        if batch:
            _kernels().forward_kernel[(batch,)](
                match, links, alpha, glen, tlen, steps, size,
                BLOCK_I=BLOCK, BLOCK_J=BLOCK, num_warps=NUM_WARPS,
            )  # fmt: skip
        rows = torch.arange(batch, device=match.device)
        log_z = alpha[rows, tlen - 1, glen - 1]  # (B,)
        log_z = torch.where(tlen > glen, torch.full_like(log_z, _NEG_INF), log_z)
        ctx.save_for_backward(match, links, alpha, log_z, glen, tlen)
        return log_z

    @staticmethod
    def backward(ctx, grad_log_z):
        match, links, alpha, log_z, glen, tlen = ctx.saved_tensors
        batch, steps, size = match.shape
        finite = torch.isfinite(log_z)  # (B,)
        shift = torch.where(finite, log_z, torch.zeros_like(log_z))  # (B,)
        # A sentence without a path (or an upstream inf/NaN) gets gradient 0, as the torch path.
        scale = torch.where(finite & torch.isfinite(grad_log_z), grad_log_z, 0.0)  # (B,)
        beta = torch.full_like(match, _NEG_INF)  # (B, T, L)
        grad_links = torch.empty_like(links)  # (B, L, L)
        if batch:
            kernels = _kernels()
            kernels.backward_kernel[(batch,)](
                match, links, beta, glen, tlen, steps, size,
                BLOCK_I=BLOCK, BLOCK_J=BLOCK, num_warps=NUM_WARPS,
            )  # fmt: skip
            tiles = -(-size // BLOCK)
            kernels.links_grad_kernel[(batch, tiles, tiles)](
                match, links, alpha, beta, shift.contiguous(), scale.contiguous(), grad_links,
                glen, tlen, steps, size,
                BLOCK_I=BLOCK, BLOCK_J=BLOCK, num_warps=NUM_WARPS,
            )  # fmt: skip
        # Vertex posteriors; exp(−inf) = 0 off the graph and past T_b (α, β are −inf there).
        grad_match = (alpha + beta - shift[:, None, None]).exp() * scale[:, None, None]
        return grad_match, grad_links, None, None


def log_likelihood(
    match: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """log P(y | x) per sentence by the Triton kernels, differentiable w.r.t. ``match`` and
    ``links``.

    Callers go through :func:`fadat.dag.dag_log_likelihood_from_match` (``backend=``), which
    checks shapes and lengths first.

    Args:
        match: ``(B, T, L)`` float32 ``log P(y_t | vertex j)``; entries at ``j ≥ L_b`` or
            ``t ≥ T_b`` are never read.
        links: ``(B, L, L)`` float32 ``log E``; entries outside ``i < j < L_b`` are never read.
        graph_lengths: ``(B,)`` int ``L_b`` in ``[1, L]``.
        target_lengths: ``(B,)`` int ``T_b`` in ``[1, T]``.

    Returns:
        ``(B,)`` float32; −inf where no path exists (``T_b > L_b``), gradient 0 there.
    """
    return _LikelihoodFn.apply(match, links, graph_lengths, target_lengths)


@torch.no_grad()
def best_alignment(
    match: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """Target index per vertex on the most probable path, by the Triton Viterbi kernel.

    Callers go through :func:`fadat.dag.best_alignment_from_match` (``backend=``).

    Args:
        match: ``(B, T, L)`` float32.
        links: ``(B, L, L)`` float32 ``log E``.
        graph_lengths: ``(B,)`` int ``L_b``.
        target_lengths: ``(B,)`` int ``T_b``.

    Returns:
        ``(B, L)`` int64: the aligned target index, −1 off the path; all −1 where no path
        exists. Ties go to the lowest source vertex, as the PyTorch path.
    """
    match, links, glen, tlen = _inputs(match, links, graph_lengths, target_lengths)
    batch, steps, size = match.shape
    path = torch.full((batch, size), -1, dtype=torch.int64, device=match.device)  # (B, L)
    if batch:
        alpha = torch.full_like(match, _NEG_INF)  # (B, T, L)
        back = torch.zeros(batch, steps, size, dtype=torch.int32, device=match.device)
        _kernels().viterbi_kernel[(batch,)](
            match, links, alpha, back, path, glen, tlen, steps, size,
            BLOCK_I=BLOCK, BLOCK_J=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    return path
