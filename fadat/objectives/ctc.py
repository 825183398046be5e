"""The CTC objective (``ctc``, trains ``--arch ctc``, :mod:`fadat.models.ctc`): ``F.ctc_loss`` of
``y`` on the upsampled decoder, with glancing from the best CTC alignment when the glancing
ratio is > 0 (CTC + GLAT, Qian et al. 2021; the rule is in :mod:`fadat.models.ctc`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fadat.data.contract import PAD_ID, Batch
from fadat.models.ctc import best_alignment, content_targets
from fadat.models.transformer import decoder_input
from fadat.objectives.base import Objective
from fadat.objectives.glancing import choose_glanced, draw_seed, forked_rng, glance_count
from fadat.objectives.losses import LossOutput


def step(model: nn.Module, batch: Batch, settings: Any) -> LossOutput:
    """One micro-batch of the CTC objective (with glancing when ``settings.glancing_ratio > 0``).

    Returns:
        :class:`~fadat.objectives.losses.LossOutput`: the sum of per-sentence ``−log P(y|x) / |y|``,
        counted per sentence; stats ``nll_sum`` (Σ −log P(y|x), nats), ``content_tokens`` (Σ |y|),
        ``invalid_too_long``
        (targets with no alignment), ``glanced``, ``target_tokens``, ``sentences``.
    """
    glancing_ratio = settings.glancing_ratio
    lengths = model.graph_lengths(batch.source_lengths)  # (B,)
    content, content_lengths = content_targets(batch.target, batch.target_lengths)  # (B, U), (B,)
    encoder_out = model.encode(batch.source)
    tokens = decoder_input(lengths, ends=False)  # (B, L)
    seed = draw_seed()
    glanced = 0.0
    if glancing_ratio > 0:
        with torch.no_grad(), forked_rng(tokens.device, seed):
            logits = model.decode_logits(encoder_out, tokens)  # (B, L, V+1)
        with torch.no_grad(), torch.autocast(tokens.device.type, enabled=False):
            lp = torch.log_softmax(logits.float(), dim=-1)
            path, _ = best_alignment(lp, content, lengths, content_lengths, model.blank)
            oracle = content.gather(1, path.clamp(min=0)).masked_fill(path < 0, PAD_ID)  # (B, L)
            aligned = path >= 0  # (B, L)
            correct = ((lp.argmax(dim=-1) == oracle) & aligned).sum(dim=1)  # (B,)
        chosen = choose_glanced(path, glance_count(aligned.sum(dim=1), correct, glancing_ratio))
        tokens = torch.where(chosen, oracle, tokens)  # (B, L)
        glanced = float(chosen.sum())
    with forked_rng(tokens.device, seed):
        logits = model.decode_logits(encoder_out, tokens)  # (B, L, V+1)
    with torch.autocast(logits.device.type, enabled=False):
        lp = torch.log_softmax(logits.float(), dim=-1)
        nll = F.ctc_loss(
            lp.transpose(0, 1),
            content,
            lengths,
            content_lengths,
            blank=model.blank,
            reduction="none",
            zero_infinity=True,
        )  # (B,); 0 for a target with no alignment
    # zero_infinity turned a target with no alignment into a loss of 0 (a feasible one is > 0)
    invalid = (nll.detach() == 0) & (content_lengths > 0)  # (B,)
    losses = (nll / content_lengths.clamp(min=1)).masked_fill(invalid, 0.0)  # (B,)
    stats = {
        "nll_sum": float(nll.detach().sum()),
        "content_tokens": float(content_lengths.sum()),
        "invalid_too_long": float(invalid.sum()),
        "glanced": glanced,
        "target_tokens": float(batch.target_lengths.sum()),
        "sentences": float(len(batch)),
    }
    return LossOutput(loss_sum=losses.sum(), count=len(batch), stats=stats)


def log(stats: dict[str, float]) -> dict[str, Any]:
    """−log P(y|x) per target token (nats), alignment-less targets, glancing."""
    return {
        "nll": stats["nll_sum"] / max(stats["content_tokens"], 1.0),
        "invalid_too_long": int(stats["invalid_too_long"]),
        "glancing_ratio": stats["glancing_ratio"],
        "glanced": int(stats["glanced"]),
    }


CTC = Objective(
    name="ctc",
    architecture="ctc",
    step=step,
    statistics=("nll_sum", "content_tokens", "invalid_too_long", "glanced"),
    log=log,
    glancing="0.5:0.3@300k",  # GLAT's schedule; "0" trains plain CTC
    default_for=True,
)
