"""The likelihood of a reference on a DAG (paper Eq. 3), with a hand-written backward: the
vertex-token match (:func:`gather_match`), the forward/backward programmes in probability space
(with float64 recomputation on underflow) or log space, in cache-sized chunks of sentences, and
``log P(y|x)`` of decoded outputs on graphs already computed (:func:`outputs_log_prob`).
Conventions: :mod:`fadat.dag`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fadat.dag._shared import (
    _NEG_INF,
    _check_lengths,
    _chunks,
    _flushed_exp,
    _map_chunks,
    _masked_links,
    _serial_on_cpu,
    _use_triton,
    _valid_links,
)
from fadat.data.contract import BOS_ID, EOS_ID, pad_sequences

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


def outputs_log_prob(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    owner: list[int],
    outputs: list[list[int]],
) -> list[float]:
    """``log P(y|x)`` (paper Eq. 3) of given outputs on graphs already computed: the DP of
    :meth:`fadat.models.dat.DATModel.score_batch` without its decoder pass.

    Args:
        token_logprobs: ``(B, L, V)`` fp32, links ``(B, L, L)`` fp32, graph_lengths ``(B,)``
            int64: :meth:`fadat.models.dat.DATModel.graph_outputs`.
        owner: per output, the batch row whose graph scores it.
        outputs: per output, its token ids without ``<s>``/``</s>`` (``|<s> y </s>|`` tokens
            are scored; ``-inf`` where that exceeds the graph's vertices).

    Returns:
        One float per output, in nats.
    """
    if not outputs:
        return []
    index = torch.tensor(owner, device=token_logprobs.device)  # (N,)
    targets, target_lengths = bos_eos_targets(outputs, token_logprobs.device)  # (N, T), (N,)
    match = gather_match(token_logprobs[index], targets)  # (N, T, L)
    return dag_log_likelihood_from_match(
        match, links[index], graph_lengths[index], target_lengths
    ).tolist()


def bos_eos_targets(
    outputs: list[list[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists ``y`` → the targets of the likelihood: ``<s> y </s>`` right-padded with
    ``<pad>`` ``(N, T)`` int64 on ``device``, and their lengths ``(N,)`` int64."""
    rows = [[BOS_ID, *tokens, EOS_ID] for tokens in outputs]
    lengths = torch.tensor([len(r) for r in rows], device=device)  # (N,)
    return pad_sequences(rows).to(device), lengths
