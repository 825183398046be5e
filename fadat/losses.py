"""Loss math on the network's outputs that the objectives share: the reference tokens'
log-probabilities straight from the logits (:func:`target_logprobs`, with a hand-written backward).
"""

from __future__ import annotations

import torch
from torch import Tensor


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
    anchor-spec §2) without materialising the ``(B, L, V)`` fp32 log-softmax or its gradient:
    the training step's largest memory traffic on CPU.

    Args:
        logits: ``(B, L, V)`` fp32, bf16, fp16 or fp64 output-projection logits.
        targets: ``(B, T)`` int64 token ids in ``[0, V)`` (padding ids included; the DAG DP
            ignores positions past ``T_b``).
        block: rows of ``(B·L, V)`` processed at once.
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
    return _TargetLogProbs.apply(logits, targets, block, inplace_backward)
