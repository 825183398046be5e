"""The loss math the objectives share, on the network's outputs: the reference tokens'
log-probabilities straight from the logits (:func:`target_logprobs`, with a hand-written
backward), the DAG negative log-likelihood with force-emit, the FA-DAT fuzzy alignment loss and
the label-smoothed cross-entropy.

Every loss returns a :class:`LossOutput` whose ``loss_sum`` is a SUM over the sentences (or, for
the cross-entropy, the target tokens) of one micro-batch, with the count it is to be divided by.
The trainer divides by the count of the whole update (all micro-batches, all ranks), so one
process with a global batch and several processes with its shards compute the same gradient.
Sources: docs/reference-behaviour.md ("DAG likelihood", "Fuzzy alignment loss"); the FA-DAT
paper's loss ``L = −BP · p′_n``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from fadat import dag
from fadat.data.contract import PAD_ID


class GlancedVertices(Protocol):
    """The two fields of a glancing decision that force-emit reads
    (:class:`fadat.objectives.glancing.GlanceResult` has them; typed here so that the loss does not
    import the glancing module, which imports this one).

    Attributes:
        path: ``(B, L)`` int64 best alignment of pass 1 (−1 off the path).
        glanced: ``(B, L)`` bool, vertices whose input was replaced by the oracle token.
    """

    path: Tensor
    glanced: Tensor


#: On CUDA, the row blocks of :func:`target_logprobs` hold up to this many logits (2²⁷: 512 MiB
#: of fp32 log-probabilities): the CPU's 256-row blocks, sized for its caches, made a micro-batch
#: of 28k vertices 112 blocks of small kernels on an H100, and the step waited on their launches
#: (docs/results/gpu.md). At V = 4000 a whole ``--max-tokens 32768`` micro-batch is one block.
CUDA_BLOCK_ELEMENTS = 2**27


def _rows_per_block(logits: Tensor, block: int) -> int:
    """``block`` on the CPU; on CUDA at least ``CUDA_BLOCK_ELEMENTS // V`` rows."""
    if logits.is_cuda:
        return max(block, CUDA_BLOCK_ELEMENTS // max(1, logits.shape[-1]))
    return block


def _vertex_targets(targets: Tensor, size: int) -> Tensor:
    """``(B, T)`` target ids repeated for each of ``size`` vertices: ``(B·size, T)`` int64."""
    batch, steps = targets.shape
    return targets[:, None, :].expand(batch, size, steps).reshape(batch * size, steps)


class _TargetLogProbs(torch.autograd.Function):
    """``log_softmax(logits)`` gathered at the target ids, with a hand-written backward.

    Forward and backward run over row blocks of ``(B·L, V)`` so that no ``(B, L, V)`` fp32
    tensor exists: the log-softmax is taken in fp32 (or fp64) block by block and gathered, and
    the gradient ``scatter(g) − softmax · Σ_t g`` of each block (the softmax recomputed) is
    written straight into the logits' dtype: into a new tensor, or with ``inplace_backward``
    into the logits' own storage, block by block after that block's softmax is taken.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, logits: Tensor, targets: Tensor, block: int, inplace_backward: bool
    ) -> Tensor:
        batch, size, vocab = logits.shape
        wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
        flat = logits.reshape(batch * size, vocab)
        index = _vertex_targets(targets, size)  # (B·L, T)
        steps = index.shape[1]
        # torch's fused (log_)softmax kernels with an fp32 output are ≈ 1.5x faster on CPU than
        # logsumexp (max, subtract, exp, sum, log as separate passes) on the cast block
        out = torch.empty(batch * size, steps, dtype=wide, device=logits.device)  # (B·L, T)
        for start in range(0, batch * size, block):
            stop = start + block
            logprobs = torch.log_softmax(flat[start:stop], dim=-1, dtype=wide)
            out[start:stop] = logprobs.gather(1, index[start:stop])
        ctx.save_for_backward(logits, targets)
        ctx.block, ctx.wide = block, wide
        ctx.inplace = inplace_backward and logits.is_contiguous()
        ctx.consumed = False
        return out.view(batch, size, steps).transpose(1, 2)  # (B, T, L)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if ctx.consumed:
            raise RuntimeError(
                "target_logprobs(inplace_backward=True): the first backward overwrote the logits "
                "with their gradient; a second backward (retain_graph) cannot run"
            )
        logits, targets = ctx.saved_tensors
        batch, size, vocab = logits.shape
        steps = targets.shape[1]
        g = grad.transpose(1, 2).reshape(batch * size, steps)  # (B·L, T)
        g_total = g.sum(dim=-1)  # (B·L,)
        index = _vertex_targets(targets, size)  # (B·L, T)
        flat = logits.reshape(batch * size, vocab)
        out = flat if ctx.inplace else torch.empty_like(flat)  # (B·L, V)
        ctx.consumed = ctx.inplace
        for start in range(0, batch * size, ctx.block):
            stop = start + ctx.block
            probs = torch.softmax(flat[start:stop], dim=-1, dtype=ctx.wide)
            probs.mul_(-g_total[start:stop, None])
            probs.scatter_add_(1, index[start:stop], g[start:stop].to(ctx.wide))
            out[start:stop] = probs
        return out.view(batch, size, vocab), None, None, None


def target_logprobs(
    logits: Tensor, targets: Tensor, block: int = 256, inplace_backward: bool = False
) -> Tensor:
    """Log-probabilities of the reference tokens at every vertex, straight from the logits.

    Equals ``fadat.dag.gather_match(log_softmax(logits.float(), -1), targets)`` (the "match" of
    docs/reference-behaviour.md, "DAG likelihood") without materialising the ``(B, L, V)`` fp32
    log-softmax or its gradient: the training step's largest memory traffic on CPU.

    Args:
        logits: ``(B, L, V)`` fp32, bf16, fp16 or fp64 output-projection logits.
        targets: ``(B, T)`` int64 token ids in ``[0, V)`` (padding ids included; the DAG DP
            ignores positions past ``T_b``).
        block: rows of ``(B·L, V)`` processed at once on the CPU; on CUDA at least
            ``CUDA_BLOCK_ELEMENTS // V`` (fewer, larger kernels).
        inplace_backward: the backward writes the gradient into the storage of ``logits``
            (contiguous ones; others get a new tensor) instead of a new ``(B, L, V)`` tensor,
            as fused cross-entropy kernels do: one large allocation less per training step,
            whose first touch is what costs on CPU. ``logits`` hold the gradient after the
            backward, so only a caller that owns them may set it; their version counter moves,
            so an autograd node that saved them raises if it runs later, and a second backward
            through this node raises.

    Returns:
        ``(B, T, L)`` fp32 (fp64 for fp64 logits), differentiable w.r.t. ``logits``; the
        gradient comes back in the logits' dtype.

    Raises:
        ValueError: bad shapes or a target id outside ``[0, V)``.
    """
    if logits.dim() != 3 or targets.dim() != 2 or targets.shape[0] != logits.shape[0]:
        raise ValueError(
            f"need logits (B, L, V) and targets (B, T), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= logits.shape[-1]):
        raise ValueError(f"target ids must lie in [0, {logits.shape[-1]})")
    return _TargetLogProbs.apply(logits, targets, _rows_per_block(logits, block), inplace_backward)


def widen(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 → fp32; fp32 and fp64 unchanged (tests use fp64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


# Losses on the DAG outputs
# --------------------------------------------------------------------------------------------


@dataclass
class LossOutput:
    """One micro-batch's contribution.

    Attributes:
        loss_sum: scalar fp32 tensor (with grad): the SUM of per-sentence (or per-token) losses.
        count: number of sentences (DAG objectives) or target tokens (AT) that ``loss_sum``
            sums over; the trainer divides by the update's total count.
        stats: additive statistics for logging (sums over this micro-batch), e.g.
            ``invalid_too_long``, ``invalid_nonfinite``, ``glanced``, ``precision_sum``.
    """

    loss_sum: torch.Tensor
    count: int
    stats: dict[str, float] = field(default_factory=dict)


def force_emit_match(
    match: torch.Tensor, path: torch.Tensor, glanced: torch.Tensor
) -> torch.Tensor:
    """Force-emit, docs/reference-behaviour.md, "Force-emit" (FA-DAT): a glanced vertex j aligned to
    target t* may only emit y_{t*}; column j of ``match`` keeps row t* (detached) and is −inf
    elsewhere. Other vertices may still emit y_{t*}.

    Args:
        match: ``(B, T, L)`` fp32 log-probabilities ``log p(y_t | v_j)``.
        path: ``(B, L)`` int64 target index per vertex (−1 off the path).
        glanced: ``(B, L)`` bool glanced vertices (all on the path).

    Returns:
        ``(B, T, L)`` fp32.
    """
    t = torch.arange(match.shape[1], device=match.device)  # (T,)
    pinned = (t[None, :, None] == path[:, None, :]) & glanced[:, None, :]  # (B, T, L)
    column = glanced[:, None, :].expand_as(match)  # (B, T, L)
    out = torch.where(column & ~pinned, torch.full_like(match, -math.inf), match)
    return torch.where(pinned, match.detach(), out)  # (B, T, L)


def nll_loss(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    glance: GlancedVertices | None = None,
    force_emit: bool = True,
    backend: str = "auto",
) -> LossOutput:
    """DAG negative log-likelihood (docs/reference-behaviour.md, "DAG likelihood"; paper §2.2 ``L =
    −log P(y|x)``).

    Per sentence ``ℓ_b = −log P(y_b|x_b) / T_b``. Sentences that cannot be aligned (T_b > L_b,
    cause ``too_long``) or whose log-likelihood is not finite (cause ``nonfinite``) contribute 0
    and stay in the count, as the reference. Too-long sentences are removed before the DP so that
    their −inf never reaches the backward pass.

    Args:
        token_logprobs: ``(B, L, V)`` fp32 log-probabilities.
        links: ``(B, L, L)`` fp32 log transition probabilities.
        targets: ``(B, T)`` int64 ``<s> y </s>``, right-padded.
        graph_lengths: ``(B,)`` int64 L_b.
        target_lengths: ``(B,)`` int64 T_b.
        glance: the glancing decision of pass 1; with ``force_emit`` the glanced vertices are
            pinned to their oracle token (docs/reference-behaviour.md, "Force-emit").
        force_emit: apply force-emit to glanced vertices.
        backend: the DAG likelihood's implementation, ``"auto"``, ``"torch"`` or ``"triton"``
            (:func:`fadat.dag.dag_log_likelihood_from_match`).

    :func:`nll_loss_from_logits` is the same loss from the output-projection logits (the
    training step's path: no ``(B, L, V)`` fp32 log-softmax).

    Returns:
        :class:`LossOutput` with ``loss_sum = Σ_b ℓ_b``, ``count = B``, the invalid counts and
        ``underflow_recomputed`` (sentences the DP recomputed in float64, see fadat.dag).
    """
    return _nll(
        lambda rows, tgt: dag.gather_match(widen(token_logprobs[rows]), tgt),
        links,
        targets,
        graph_lengths,
        target_lengths,
        glance,
        force_emit,
        backend,
    )


def nll_loss_from_logits(
    logits: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    glance: GlancedVertices | None = None,
    force_emit: bool = True,
    inplace_backward: bool = False,
    backend: str = "auto",
) -> LossOutput:
    """:func:`nll_loss` with ``token_logprobs = log_softmax(logits)``, computed through
    :func:`fadat.objectives.losses.target_logprobs` (``logits`` ``(B, L, V)`` in any float dtype;
    the other arguments and the result as :func:`nll_loss`). With ``inplace_backward`` the backward
    overwrites ``logits`` with their gradient (see ``target_logprobs``): for a caller that
    owns them, as the training step does."""

    return _nll(
        lambda rows, tgt: target_logprobs(
            fit_rows(logits, rows), tgt, inplace_backward=inplace_backward
        ),
        links,
        targets,
        graph_lengths,
        target_lengths,
        glance,
        force_emit,
        backend,
    )


def fit_rows(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``logits[rows]`` for the sorted ``(B',)`` indices of the sentences that fit their graph;
    ``logits`` itself when all do (the usual case), without a ``(B, L, V)`` copy."""
    return logits if len(rows) == len(logits) else logits[rows]


def _nll(
    match_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    glance: GlancedVertices | None,
    force_emit: bool,
    backend: str,
) -> LossOutput:
    """The body of :func:`nll_loss`; ``match_of(rows, targets[rows, :T'])`` gives the
    ``(B', T', L)`` match of the sentences that fit."""
    batch = targets.shape[0]
    fits = target_lengths <= graph_lengths  # (B,)
    loss_sum = links.new_zeros(())
    nonfinite = underflow = 0
    if bool(fits.any()):
        rows = fits.nonzero().squeeze(1)
        width = int(target_lengths[rows].max())
        match = match_of(rows, targets[rows, :width])  # (B', T', L)
        if glance is not None and force_emit:
            match = force_emit_match(match, glance.path[rows], glance.glanced[rows])
        ll, dag_stats = dag.dag_log_likelihood_from_match(
            match,
            widen(links[rows]),
            graph_lengths[rows],
            target_lengths[rows],
            return_stats=True,
            backend=backend,
        )  # (B',)
        underflow = dag_stats.underflow_recomputed
        finite = torch.isfinite(ll)  # (B',)
        nonfinite = int((~finite).sum())
        per_sentence = -ll / target_lengths[rows].to(ll.dtype)  # (B',)
        loss_sum = torch.where(finite, per_sentence, torch.zeros_like(per_sentence)).sum()
    stats = {
        "invalid_too_long": float(batch - int(fits.sum())),
        "invalid_nonfinite": float(nonfinite),
        "underflow_recomputed": float(underflow),
    }
    return LossOutput(loss_sum=loss_sum, count=batch, stats=stats)


def fuzzy_loss(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    order: int = 2,
) -> LossOutput:
    """FA-DAT fuzzy alignment loss ``ℓ_b = −BP_b · p′_n,b`` (docs/reference-behaviour.md, "Fuzzy
    alignment loss"; paper eq. loss).

    The n-gram statistics come from :func:`fadat.dag.fuzzy_alignment` (single order n, clipped
    expected matches over expected n-gram count, BP from expected length vs T_b, both counting
    ``<s>``/``</s>``). No force-emit, no log, as the reference. Non-finite scores contribute 0
    (cause ``nonfinite``).

    Args:
        token_logprobs: ``(B, L, V)`` fp32 log-probabilities.
        links: ``(B, L, L)`` fp32 log transition probabilities.
        targets: ``(B, T)`` int64.
        graph_lengths: ``(B,)`` int64.
        target_lengths: ``(B,)`` int64.
        order: the n-gram order n (default 2).

    Returns:
        :class:`LossOutput` with ``loss_sum = Σ_b −BP_b·p_b``, ``count = B``, and sums of
        precision, BP and length ratio ``E|A| / T`` for logging.
    """
    result = dag.fuzzy_alignment(
        widen(token_logprobs), widen(links), targets, graph_lengths, target_lengths, order=order
    )
    score = result.score  # (B,) = BP · p
    finite = torch.isfinite(score)  # (B,)
    per_sentence = torch.where(finite, -score, torch.zeros_like(score))  # (B,)
    ratio = result.expected_length / target_lengths.to(result.expected_length.dtype)  # (B,)
    stats = {
        "invalid_too_long": 0.0,
        "invalid_nonfinite": float((~finite).sum()),
        "precision_sum": float(result.precision.detach().nan_to_num().sum()),
        "bp_sum": float(result.brevity_penalty.detach().nan_to_num().sum()),
        "length_ratio_sum": float(ratio.detach().nan_to_num().sum()),
    }
    return LossOutput(loss_sum=per_sentence.sum(), count=targets.shape[0], stats=stats)


# --------------------------------------------------------------------------------------------
# The autoregressive baseline
# --------------------------------------------------------------------------------------------


def label_smoothed_nll(
    token_logprobs: torch.Tensor, gold: torch.Tensor, epsilon: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy per token, as fairseq's ``label_smoothed_cross_entropy``:
    ``(1 − ε − ε/(V−1))·nll + ε/(V−1)·Σ_v −log p_v``.

    Args:
        token_logprobs: ``(B, T, V)`` fp32 log-probabilities.
        gold: ``(B, T)`` int64 gold next tokens, ``<pad>`` where there is none.
        epsilon: smoothing mass ε in [0, 1).

    Returns:
        ``(loss, nll)``: two ``(B, T)`` fp32 tensors, zero at pad positions.
    """
    nll = -token_logprobs.gather(-1, gold.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -token_logprobs.sum(dim=-1)  # (B, T)
    eps_i = epsilon / (token_logprobs.shape[-1] - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth  # (B, T)
    keep = gold != PAD_ID  # (B, T)
    return loss.masked_fill(~keep, 0.0), nll.masked_fill(~keep, 0.0)
