"""The DAG math of DA-Transformer and FA-DAT: pure functions on tensors, no module state.

A graph of ``L_b`` vertices carries token distributions ``token_logprobs`` and transitions
``links``; a path starts at vertex 0, ends at vertex ``L_b − 1`` and visits strictly increasing
vertices (paper §2.2, docs/reference-behaviour.md, "DAG likelihood"). Conventions shared by every
function:

- ``token_logprobs``: ``(B, L, V)`` float, ``log P(token | vertex)``.
- ``links``: ``(B, L, L)`` float, ``log E[i, j]``; −inf where ``j ≤ i`` or ``j ≥ L_b``; every row
  ``i < L_b − 1`` log-sums to 0. Entries outside the valid triangle are ignored (masked here), so
  padding may hold anything finite or −inf.
- ``targets``: ``(B, T)`` int64, ``targets[b, :T_b]`` is the reference (the objectives pass
  ``<s> y </s>``, so ``T_b`` counts both; docs/reference-behaviour.md, "DAG likelihood" / "Fuzzy
  alignment loss"); entries beyond ``T_b`` are ignored.
- ``graph_lengths`` ``(B,)`` and ``target_lengths`` ``(B,)``: int64, ``1 ≤ L_b ≤ L``,
  ``1 ≤ T_b ≤ T``.

Everything works in float32 (training) and float64 (tests) and is device-agnostic; it was run on
CPU only (CUDA was not run here). The likelihood (forward and backward) and the best alignment
also exist as Triton kernels (:mod:`fadat.kernels.triton_dag`), chosen with the ``backend``
argument (``"auto"`` keeps this PyTorch path until the kernels have passed ``tests/test_cuda.py``
on a GPU: ``AUTO_USES_TRITON``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import torch

__all__ = [
    "FuzzyAlignment",
    "LikelihoodStats",
    "best_alignment",
    "best_alignment_from_match",
    "dag_log_likelihood",
    "dag_log_likelihood_from_match",
    "fuzzy_alignment",
    "gather_match",
    "passing_probabilities",
    "reference_ngrams",
]

_NEG_INF = float("-inf")
_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _check_lengths(lengths: torch.Tensor, size: int, name: str) -> None:
    """Raise ValueError unless ``lengths`` is a (B,) integer tensor with values in [1, size]."""
    if lengths.dim() != 1 or lengths.dtype.is_floating_point:
        raise ValueError(f"{name} must be a (B,) integer tensor, got {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.max()) > size):
        raise ValueError(f"{name} must lie in [1, {size}], got {lengths.tolist()}")


def _valid_links(graph_lengths: torch.Tensor, size: int) -> torch.Tensor:
    """(B, L, L) bool: the transitions i → j that exist, ``i < j < L_b``."""
    idx = torch.arange(size, device=graph_lengths.device)
    upper = idx[None, :, None] < idx[None, None, :]  # (1, L, L)
    inside = idx[None, None, :] < graph_lengths[:, None, None]  # (B, 1, L)
    return upper & inside  # (B, L, L)


def _masked_links(links: torch.Tensor, graph_lengths: torch.Tensor) -> torch.Tensor:
    """``links`` with −inf outside the valid triangle (so padding content never matters)."""
    if links.dim() != 3 or links.shape[1] != links.shape[2]:
        raise ValueError(f"links must be (B, L, L), got {tuple(links.shape)}")
    _check_lengths(graph_lengths, links.shape[1], "graph_lengths")
    valid = _valid_links(graph_lengths, links.shape[1])  # (B, L, L)
    return torch.where(valid, links, _NEG_INF)  # (B, L, L)


def _use_triton(tensor: torch.Tensor, backend: str) -> bool:
    """Whether a DP on ``tensor`` runs in the Triton kernels (:mod:`fadat.kernels.triton_dag`;
    ``backend`` is ``"auto"``, ``"torch"`` or ``"triton"``, see
    :func:`fadat.kernels.triton_dag.use_triton`). Imports nothing of Triton for ``"torch"`` or a
    CPU tensor under ``"auto"``."""
    if backend == "torch" or (backend == "auto" and not tensor.is_cuda):
        return False
    from fadat.kernels import triton_dag

    return triton_dag.use_triton(tensor, backend)


def _exp_floor(dtype: torch.dtype) -> float:
    """The log of the smallest normal number of ``dtype``, rounded up a little (f32: −86.8)."""
    return math.log(torch.finfo(dtype).tiny) + 0.5


def _flushed_exp(x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``exp(x)``, with results below ``exp(_exp_floor)`` (≈ 2e−38 in float32) set to exactly 0
    (and entries where the bool ``keep`` is False, if given, too). Not for autograd.

    On CPU, ``torch.exp`` leaves its vectorised path when a result is subnormal or underflows:
    measured on (64, 240, 240) float32 inputs, 4.6 ms at −87.3 but 205 ms at −88 and 60–75 ms
    below −104 (results 0). Link log-probabilities of far jumps lie there, so the exponent is
    clamped first and those entries are zeroed after: the values flush-to-zero arithmetic would
    give. −inf maps to 0.
    """
    floor = _exp_floor(x.dtype)
    small = x < floor  # (same shape as x)
    if keep is not None:
        small |= ~keep
    return x.clamp(min=floor).exp_().masked_fill_(small, 0.0)


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


# --------------------------------------------------------------------------------------------
# 2. Likelihood of a reference (Eq. 3), with a hand-written backward
# --------------------------------------------------------------------------------------------


def gather_match(token_logprobs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of each reference token at each vertex (docs/reference-behaviour.md, "DAG
    likelihood" "match").

    Args:
        token_logprobs: ``(B, L, V)`` float, ``log P(token | vertex)``.
        targets: ``(B, T)`` int64 token ids in ``[0, V)``; negative ids (e.g. −100 padding) are
            allowed and give garbage rows that the DP ignores beyond ``T_b``.

    Returns:
        ``(B, T, L)`` same dtype: ``match[b, t, j] = token_logprobs[b, j, targets[b, t]]``.
        Differentiable w.r.t. ``token_logprobs`` (gather; its backward is a scatter into the
        ``(B, L, V)`` gradient, never a ``(B, T, L, V)`` tensor).

    Raises:
        ValueError: bad shapes or a target id ``≥ V``.
    """
    if token_logprobs.dim() != 3 or targets.dim() != 2:
        raise ValueError(
            f"need token_logprobs (B, L, V) and targets (B, T), got "
            f"{tuple(token_logprobs.shape)} and {tuple(targets.shape)}"
        )
    batch, size, vocab = token_logprobs.shape
    if targets.shape[0] != batch:
        raise ValueError(f"batch sizes differ: {batch} vs {targets.shape[0]}")
    if targets.numel() and int(targets.max()) >= vocab:
        raise ValueError(f"target id {int(targets.max())} out of range for V = {vocab}")
    index = targets.clamp(min=0)[:, None, :].expand(batch, size, targets.shape[1])  # (B, L, T)
    return token_logprobs.gather(2, index).transpose(1, 2).contiguous()  # (B, T, L)


class LikelihoodStats(NamedTuple):
    """Counts from one :func:`dag_log_likelihood` call (ints, for logging).

    Attributes:
        too_short: sentences with ``T_b > L_b`` (no path exists; log-likelihood −inf, gradient 0).
        underflow_recomputed: sentences whose scaled exp-space forward lost too much
            precision and were recomputed exactly by a float64 log-space DP. (The backward
            may additionally recompute the gradient of a sentence whose backward messages
            underflow; those happen after the call returns and are not counted.)
    """

    too_short: int
    underflow_recomputed: int


# On CPU the per-step matvecs are memory-bound when E of the whole batch is streamed from RAM at
# every target step; running the DP on chunks of sentences whose E stays in cache is ~3x faster.
_CHUNK_BYTES = 4 * 2**20


def _chunks(batch: int, size: int, tensor: torch.Tensor, workers: int = 1) -> list[slice]:
    """Sentence slices for the per-step DP loops: whole batch on GPU, cache-sized on CPU.

    On CPU the number of slices is rounded up to a multiple of ``workers`` and the slices are
    made equal, so that :func:`_map_chunks` keeps every worker equally busy.
    """
    if tensor.device.type != "cpu":
        return [slice(0, batch)]
    step = max(1, _CHUNK_BYTES // (size * size * tensor.element_size()))
    count = -(-batch // step)
    count = -(-count // workers) * workers
    step = -(-batch // count)
    return [slice(s, min(s + step, batch)) for s in range(0, batch, step)]


@contextlib.contextmanager
def _serial_on_cpu(tensor: torch.Tensor) -> Iterator[int]:
    """Run the per-step DP loops on one intra-op thread on CPU (restored afterwards).

    Each step's ops are small (one chunk of sentences), so an OpenMP fork/join per op gains
    little, and when the cores are oversubscribed every join waits for a descheduled thread:
    measured 10 s vs 1 s for the B=64, L=240 likelihood on 2 busy cores. Instead the chunks run
    side by side on Python threads (:func:`_map_chunks`; torch ops release the GIL). Yields the
    number of such workers: the previous intra-op thread count on CPU, 1 elsewhere. Note that
    this changes ``torch.get_num_threads()`` process-wide for the duration of the loop.
    """
    threads = torch.get_num_threads()
    if tensor.device.type != "cpu" or threads == 1:
        yield 1
        return
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


def _map_chunks(fn: Callable[[slice], _T], chunks: list[slice], workers: int) -> list[_T]:
    """``[fn(c) for c in chunks]``, on ``workers`` Python threads when there are several."""
    if workers <= 1 or len(chunks) <= 1:
        return [fn(c) for c in chunks]
    with ThreadPoolExecutor(min(workers, len(chunks))) as pool:
        return list(pool.map(fn, chunks))


def _underflow_threshold(dtype: torch.dtype) -> float:
    # A scaled quantity below sqrt(tiny) means a path-relevant share of the forward mass came
    # within ~half the exponent range of underflow: recompute in float64 log space.
    return math.sqrt(torch.finfo(dtype).tiny)


def _exp_forward(
    match: torch.Tensor, trans: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scaled forward algorithm in exp space.

    Returns ``alpha`` (B, T, L) normalised forward messages (each row sums to 1 or is all 0),
    ``weights`` (B, T, L) = exp(match − rowmax), ``shift`` (B, T) = rowmax, ``scale`` (B, T) =
    the normaliser of each step (0 where the forward mass vanished).
    """
    batch, steps, size = match.shape
    shift = match.amax(-1)  # (B, T)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))  # (B, T)
    weights = _flushed_exp(match - shift[..., None])  # (B, T, L)
    alpha = torch.zeros_like(match)  # (B, T, L)
    scale = torch.zeros_like(shift)  # (B, T)
    one = torch.ones((), dtype=match.dtype, device=match.device)
    a = torch.zeros(batch, size, dtype=match.dtype, device=match.device)  # (B, L)
    a[:, 0] = weights[:, 0, 0]
    for t in range(steps):
        if t > 0:
            a = torch.bmm(a.unsqueeze(1), trans).squeeze(1) * weights[:, t]  # (B, L)
        c = a.sum(-1)  # (B,)
        a = a / torch.where(c > 0, c, one)[:, None]  # (B, L)
        alpha[:, t] = a
        scale[:, t] = c
    return alpha, weights, shift, scale


def _exp_backward(
    alpha: torch.Tensor,
    weights: torch.Tensor,
    scale: torch.Tensor,
    trans: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward pass of the scaled DP: returns d logZ / d match (B, T, L), d logZ / d links
    (B, L, L) and ``ratio`` (B, T) = Σ_j α̂_t β̂_t (used to detect underflow; 0 past T_b)."""
    batch, steps, size = alpha.shape
    rows = torch.arange(batch, device=alpha.device)
    last = torch.zeros(batch, size, dtype=alpha.dtype, device=alpha.device)  # (B, L)
    last[rows, graph_lengths - 1] = 1.0
    one = torch.ones((), dtype=alpha.dtype, device=alpha.device)
    beta = torch.zeros_like(alpha)  # (B, T, L)
    b = torch.zeros(batch, size, dtype=alpha.dtype, device=alpha.device)  # (B, L)
    # Row-vector products against a contiguous Eᵀ are ~2x faster on CPU than E @ column.
    trans_t = trans.transpose(1, 2).contiguous()  # (B, L, L)
    for t in range(steps - 1, -1, -1):
        if t < steps - 1:
            # β_t = E (w_{t+1} ⊙ β_{t+1}), renormalised by its max to stay in range.
            b = torch.bmm((weights[:, t + 1] * b).unsqueeze(1), trans_t).squeeze(1)  # (B, L)
            m = b.amax(-1)  # (B,)
            b = b / torch.where(m > 0, m, one)[:, None]
        b = torch.where((target_lengths - 1 == t)[:, None], last, b)  # (B, L)
        beta[:, t] = b
    t_idx = torch.arange(steps, device=alpha.device)
    live = t_idx[None, :] < target_lengths[:, None]  # (B, T)
    ratio = (alpha * beta).sum(-1) * live  # (B, T)
    inv = torch.where(ratio > 0, 1.0 / torch.where(ratio > 0, ratio, one), 0.0)  # (B, T)
    # Posterior of vertex j at step t: α̂_t β̂_t / Σ_j α̂_t β̂_t (each step sums to 1).
    grad_match = alpha * beta * inv[..., None]  # (B, T, L)
    # Posterior of edge i → j between steps t−1 and t: α̂_{t−1}[i] E_ij ŵ_t[j] β̂_t[j] / (c_t r_t);
    # summed over t it is one batched matmul.
    # Past T_b the normaliser is meaningless and may be subnormal (1/c = inf, 0·inf = NaN):
    # only live steps enter the edge posteriors.
    usable = live & (scale > 0)  # (B, T)
    inv_c = torch.where(usable, 1.0 / torch.where(usable, scale, one), 0.0)  # (B, T)
    g = weights[:, 1:] * beta[:, 1:] * (inv[:, 1:] * inv_c[:, 1:])[..., None]  # (B, T-1, L)
    grad_links = torch.bmm(alpha[:, :-1].transpose(1, 2), g) * trans  # (B, L, L)
    return grad_match, grad_links, ratio


def _log_forward(
    match: torch.Tensor, links: torch.Tensor, graph_lengths: torch.Tensor, target_lengths
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-space forward DP (exact, slow: a (B, L, L) logsumexp per step).

    ``links`` must already be masked. Returns ``alpha`` (B, T, L) log forward messages and
    ``logz`` (B,) = alpha[b, T_b − 1, L_b − 1].
    """
    batch, steps, size = match.shape
    alpha = torch.full_like(match, _NEG_INF)  # (B, T, L)
    alpha[:, 0, 0] = match[:, 0, 0]
    for t in range(1, steps):
        alpha[:, t] = torch.logsumexp(alpha[:, t - 1, :, None] + links, dim=1) + match[:, t]
    rows = torch.arange(batch, device=match.device)
    return alpha, alpha[rows, target_lengths - 1, graph_lengths - 1]


def _log_backward(
    alpha: torch.Tensor,
    logz: torch.Tensor,
    match: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-space backward DP: d logZ / d match (B, T, L) and d logZ / d links (B, L, L).

    Memory O(B·(T·L + L²)): the edge posteriors are accumulated step by step.
    """
    batch, steps, size = alpha.shape
    rows = torch.arange(batch, device=alpha.device)
    ok = torch.isfinite(logz)  # (B,)
    z = torch.where(ok, logz, torch.zeros_like(logz))  # (B,)
    last = torch.full((batch, size), _NEG_INF, dtype=alpha.dtype, device=alpha.device)  # (B, L)
    last[rows, graph_lengths - 1] = 0.0
    grad_match = torch.zeros_like(alpha)  # (B, T, L)
    grad_links = torch.zeros_like(links)  # (B, L, L)
    beta = torch.full_like(last, _NEG_INF)  # (B, L)
    for t in range(steps - 1, -1, -1):
        beta = torch.where((target_lengths - 1 == t)[:, None], last, beta)  # (B, L)
        grad_match[:, t] = (alpha[:, t] + beta - z[:, None]).exp()
        if t > 0:
            h = match[:, t] + beta  # (B, L)
            edge = alpha[:, t - 1, :, None] + links + h[:, None, :]  # (B, L, L)
            grad_links += (edge - z[:, None, None]).exp()
            beta = torch.logsumexp(links + h[:, None, :], dim=2)  # (B, L)
    grad_match = grad_match * ok[:, None, None]
    grad_links = grad_links * ok[:, None, None]
    return grad_match, grad_links


class _LikelihoodFn(torch.autograd.Function):
    """log P(y | x) from ``match`` and ``links`` with a hand-written, memory-lean backward.

    Forward: scaled exp-space DP in the input dtype (one (B,1,L)×(B,L,L) matvec per target
    step). Sentences whose path-relevant forward share fell below sqrt(tiny) are recomputed by
    the float64 log-space DP; so are their gradients. Saved for backward: O(B·(T·L + L²)).
    """

    @staticmethod
    def forward(ctx, match, links, graph_lengths, target_lengths, force_logspace):
        batch, steps, size = match.shape
        rows = torch.arange(batch, device=match.device)
        # Padding vertices must not set the per-step shift (nor leak garbage): mask them.
        off_graph = torch.arange(size, device=match.device)[None, :] >= graph_lengths[:, None]
        match = match.masked_fill(off_graph[:, None, :], _NEG_INF)  # (B, T, L)
        trans = _flushed_exp(links, _valid_links(graph_lengths, size))  # (B, L, L)
        with _serial_on_cpu(trans) as workers:
            chunks = _chunks(batch, size, trans, workers)
            parts = _map_chunks(lambda c: _exp_forward(match[c], trans[c]), chunks, workers)
        alpha, weights, shift, scale = (torch.cat(x) for x in zip(*parts, strict=True))
        t_idx = torch.arange(steps, device=match.device)
        live = t_idx[None, :] < target_lengths[:, None]  # (B, T)
        end_share = alpha[rows, target_lengths - 1, graph_lengths - 1]  # (B,)
        # A vanished step (scale 0) gives log 0 = −inf; steps past T_b must add exactly 0.
        step_log = torch.where(live, scale.log() + shift, torch.zeros_like(shift))  # (B, T)
        logz = step_log.sum(-1) + end_share.log()  # (B,)
        too_short = target_lengths > graph_lengths  # (B,)
        logz = torch.where(too_short, torch.full_like(logz, _NEG_INF), logz)
        redo = ~too_short & (end_share < _underflow_threshold(match.dtype))  # (B,)
        if force_logspace:
            redo = ~too_short
        redo_idx = redo.nonzero().squeeze(1)
        log_alpha = log_z = None
        if redo_idx.numel():
            log_alpha, log_z = _log_forward(
                match[redo_idx].double(),
                _masked_links(links[redo_idx], graph_lengths[redo_idx]).double(),
                graph_lengths[redo_idx],
                target_lengths[redo_idx],
            )
            logz = logz.index_copy(0, redo_idx, log_z.to(logz.dtype))
        ctx.save_for_backward(
            match, links, trans, alpha, weights, scale, graph_lengths, target_lengths, redo
        )
        ctx.log_state = (log_alpha, log_z)
        ctx.mark_non_differentiable(too_short, redo)
        return logz, too_short, redo

    @staticmethod
    def backward(ctx, grad_logz, _g1, _g2):
        match, links, trans, alpha, weights, scale, glen, tlen, redo = ctx.saved_tensors
        with _serial_on_cpu(trans) as workers:
            parts = _map_chunks(
                lambda c: _exp_backward(alpha[c], weights[c], scale[c], trans[c], glen[c], tlen[c]),
                _chunks(alpha.shape[0], alpha.shape[2], trans, workers),
                workers,
            )
        grad_match, grad_links, ratio = (torch.cat(x) for x in zip(*parts, strict=True))
        t_idx = torch.arange(alpha.shape[1], device=alpha.device)
        live = t_idx[None, :] < tlen[:, None]  # (B, T)
        thresh = _underflow_threshold(alpha.dtype)
        # The backward messages can lose precision where the forward did not: redo those too.
        weak = (live & (ratio < thresh)).any(-1) & (tlen <= glen)  # (B,)
        # A step whose normaliser c_t is tiny (e.g. force-emitted columns leave few vertices
        # able to emit y_t) makes 1/(c_t r_t) overflow although every posterior is <= 1:
        # any sentence whose exp-space gradient is not finite is redone in log space too.
        # (A sum is finite iff every term is: the terms are posteriors in [0, 1] or inf/NaN.)
        finite = torch.isfinite(grad_links.sum((1, 2)) + grad_match.sum((1, 2)))  # (B,)
        weak |= ~finite & (tlen <= glen)
        redo_all = redo | weak  # (B,)
        idx = redo_all.nonzero().squeeze(1)
        if idx.numel():
            log_alpha, log_z = ctx.log_state
            masked = _masked_links(links[idx], glen[idx]).double()  # (n, L, L)
            if log_alpha is None or not torch.equal(idx, redo.nonzero().squeeze(1)):
                log_alpha, log_z = _log_forward(match[idx].double(), masked, glen[idx], tlen[idx])
            gm, gl = _log_backward(
                log_alpha, log_z, match[idx].double(), masked, glen[idx], tlen[idx]
            )
            grad_match = grad_match.index_copy(0, idx, gm.to(grad_match.dtype))
            grad_links = grad_links.index_copy(0, idx, gl.to(grad_links.dtype))
        too_short = tlen > glen
        g = torch.where(too_short, torch.zeros_like(grad_logz), grad_logz)  # (B,)
        g = torch.where(torch.isfinite(g), g, torch.zeros_like(g))
        return grad_match * g[:, None, None], grad_links * g[:, None, None], None, None, None


def _likelihood(
    match, links, graph_lengths, target_lengths, force_logspace=False, backend: str = "auto"
):
    if match.dim() != 3 or links.dim() != 3:
        raise ValueError(
            f"need match (B, T, L) and links (B, L, L), got {tuple(match.shape)}, "
            f"{tuple(links.shape)}"
        )
    batch, steps, size = match.shape
    if links.shape != (batch, size, size):
        raise ValueError(f"links {tuple(links.shape)} does not match match {tuple(match.shape)}")
    _check_lengths(target_lengths, steps, "target_lengths")
    _check_lengths(graph_lengths, size, "graph_lengths")
    dtype = torch.promote_types(match.dtype, links.dtype)
    if not force_logspace and _use_triton(match.to(dtype), backend):
        from fadat.kernels import triton_dag

        logz = triton_dag.log_likelihood(
            match.to(dtype), links.to(dtype), graph_lengths, target_lengths
        )
        too_short = target_lengths > graph_lengths  # (B,)
        return logz, too_short, torch.zeros_like(too_short)  # log space: nothing recomputed
    return _LikelihoodFn.apply(
        match.to(dtype),
        links.to(dtype),
        graph_lengths.long(),
        target_lengths.long(),
        force_logspace,
    )


def dag_log_likelihood_from_match(
    match: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    return_stats: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, LikelihoodStats]:
    """log P(y | x) marginalised over all paths with exactly ``T_b`` vertices, from ``match``.

    Paper Eq. 3 / docs/reference-behaviour.md, "DAG likelihood" forward DP: ``f_0 = match[0, 0]`` at
    vertex 0, ``f_t[j] = logsumexp_i(f_{t−1}[i] + links[i, j]) + match[t, j]``, ``log P =
    f_{T_b−1}[L_b−1]``. Computed as a scaled forward algorithm in exp space (one batched matvec per
    target step) with a hand-written backward (forward–backward posteriors; the link gradient is one
    batched matmul), so autograd never stores O(T·B·L²). The training loop edits ``match``
    (force-emit, docs/reference-behaviour.md, "DAG likelihood") before calling this.

    Float32 underflow guard: a sentence whose end-vertex share of the scaled forward mass (or
    any scaled forward·backward product in the backward) is below ``sqrt(finfo.tiny)`` is
    recomputed, value and gradient, by an exact float64 log-space DP. This is a heuristic
    trigger: it catches every case where the result would otherwise be −inf or lose the
    surviving paths, which is where precision is lost in practice.

    Args:
        match: ``(B, T, L)`` float32/float64 log-probabilities (see :func:`gather_match`).
        links: ``(B, L, L)`` float, ``log E``; entries outside ``i < j < L_b`` are ignored.
        graph_lengths: ``(B,)`` int64 ``L_b`` in ``[1, L]``.
        target_lengths: ``(B,)`` int64 ``T_b`` in ``[1, T]`` (counts ``<s>`` and ``</s>``).
        return_stats: also return a :class:`LikelihoodStats`.
        backend: ``"auto"`` (the Triton kernels of :mod:`fadat.kernels.triton_dag` for float32
            CUDA tensors when ``triton`` is importable and ``AUTO_USES_TRITON`` is set, else this
            PyTorch path), ``"torch"`` or ``"triton"`` (forced; on CPU tensors only under
            ``TRITON_INTERPRET=1``). The
            kernels run the log-space DP in float32 (``underflow_recomputed`` is then 0).

    Returns:
        ``(B,)`` log-likelihoods in the promoted dtype of ``match`` and ``links``: −inf (never
        NaN) where no path exists (``T_b > L_b``), with gradient 0 there. With
        ``return_stats``, a ``(values, LikelihoodStats)`` pair. Gradients flow to ``match`` and
        ``links`` only.

    Raises:
        ValueError: bad shapes or lengths out of range; an unknown ``backend``, or
            ``"triton"`` where it cannot run (see :func:`fadat.kernels.triton_dag.use_triton`).

    Device-agnostic; run on CPU only (CUDA was not run here).
    """
    logz, too_short, redo = _likelihood(
        match, links, graph_lengths, target_lengths, backend=backend
    )
    if return_stats:
        return logz, LikelihoodStats(int(too_short.sum()), int(redo.sum()))
    return logz


def dag_log_likelihood(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    return_stats: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, LikelihoodStats]:
    """log P(y | x) of the DAG (paper Eq. 3; docs/reference-behaviour.md, "DAG likelihood"),
    batched.

    ``dag_log_likelihood_from_match(gather_match(token_logprobs, targets), ...)``; see that
    function for the algorithm, the underflow guard and the statistics.

    Args:
        token_logprobs: ``(B, L, V)`` float32/float64, ``log P(token | vertex)``.
        links: ``(B, L, L)`` float, ``log E``.
        targets: ``(B, T)`` int64 (``<s> y </s>`` in training).
        graph_lengths: ``(B,)`` int64 ``L_b``.
        target_lengths: ``(B,)`` int64 ``T_b``.
        return_stats: also return a :class:`LikelihoodStats` (``too_short`` = #``T_b > L_b``,
            ``underflow_recomputed`` = #float64 recomputations).
        backend: ``"auto"``, ``"torch"`` or ``"triton"`` (see
            :func:`dag_log_likelihood_from_match`).

    Returns:
        ``(B,)`` log-likelihoods (−inf where ``T_b > L_b``, gradient 0 there); with
        ``return_stats`` a ``(values, stats)`` pair.

    Raises:
        ValueError: bad shapes, lengths or target ids.

    Device-agnostic; run on CPU only (CUDA was not run here).
    """
    match = gather_match(token_logprobs, targets)  # (B, T, L)
    return dag_log_likelihood_from_match(
        match, links, graph_lengths, target_lengths, return_stats=return_stats, backend=backend
    )


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
