"""GLAT, the Glancing Transformer (Qian et al., ACL 2021): the vanilla NAT (:mod:`fadat.models.nat`)
trained with glancing (objective ``glat``, ``--arch nat``), the paper's "GLAT" row of Table 2.

One micro-batch (:func:`glat_step`): the encoder once; pass 1 of the decoder without gradient on
the plain input ``[<s>, <unk> …, </s>]`` of the gold length; of the ``T_b − 2`` content
positions, ``c_b`` have the reference token as pass-1 argmax; ``floor((T_b − 2 − c_b)·p + 0.5)``
of them (the Hamming distance times the glancing ratio ``p``), chosen uniformly, get the
reference token as input instead of ``<unk>``; pass 2 with gradient under the same dropout seed;
:func:`fadat.models.nat.nat_loss` on the positions still ``<unk>`` (GLAT scores only the words it
did not reveal) plus the length loss. ``p`` follows the run's glancing schedule (``glat_p``; by
default GLAT's 0.5 → 0.3 over 300k updates). Decoding is the NAT's (argmax). Only CPU was run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fadat.data.contract import UNK_ID, Batch
from fadat.models.nat import NATModel, nat_loss
from fadat.models.transformer import decoder_input
from fadat.objectives.base import Objective
from fadat.objectives.glancing import choose_glanced, draw_seed, forked_rng, glance_count
from fadat.objectives.losses import LossOutput


def glance_input(
    model: NATModel,
    encoder_out,
    target: torch.Tensor,
    lengths: torch.Tensor,
    ratio: float,
    seed: int,
) -> torch.Tensor:
    """Pass 1 and the choice of revealed positions.

    Args:
        model: the network (train or eval mode).
        encoder_out: ``model.encode(source)``.
        target: ``(B, T)`` int64 ``<s> y </s>``.
        lengths: ``(B,)`` int64 ``T_b``.
        ratio: glancing ratio p in [0, 1].
        seed: the dropout seed pass 2 uses.

    Returns:
        ``(B, T)`` int64 decoder input of pass 2.
    """
    plain = decoder_input(lengths)  # (B, T)
    with torch.no_grad(), forked_rng(plain.device, seed):
        logits = model.decode_logits(encoder_out, plain)  # (B, T, V)
    gold = target[:, : plain.shape[1]]  # (B, T)
    content = plain.eq(UNK_ID)  # (B, T)
    correct = ((logits.argmax(dim=-1) == gold) & content).sum(dim=1)  # (B,)
    position = torch.arange(plain.shape[1], device=plain.device).expand_as(plain)  # (B, T)
    path = torch.where(content, position, -1)  # (B, T): revealable positions
    chosen = choose_glanced(path, glance_count(content.sum(dim=1), correct, ratio))  # (B, T)
    return torch.where(chosen, gold, plain)


def step(model: nn.Module, batch: Batch, settings: Any) -> LossOutput:
    """One micro-batch of GLAT at the update's ``settings.glancing_ratio``, counted per
    sentence (stats: ``nll_sum``, ``scored_tokens``, ``glanced``)."""
    glancing_ratio = settings.glancing_ratio
    encoder_out = model.encode(batch.source)
    seed = draw_seed()
    tokens = decoder_input(batch.target_lengths)
    if glancing_ratio > 0:
        tokens = glance_input(
            model, encoder_out, batch.target, batch.target_lengths, glancing_ratio, seed
        )
    with forked_rng(tokens.device, seed):
        losses, stats = nat_loss(
            model, batch.source, batch.target, batch.target_lengths, tokens, encoder_out
        )
    plain = decoder_input(batch.target_lengths)
    stats["glanced"] = float((tokens != plain).sum())
    stats["target_tokens"] = float(batch.target_lengths.sum())
    stats["sentences"] = float(len(batch))
    return LossOutput(loss_sum=losses.sum(), count=len(batch), stats=stats)


def log(stats: dict[str, float]) -> dict[str, Any]:
    """NLL per scored position (nats), the glancing ratio and the number of revealed tokens."""
    return {
        "nll": stats["nll_sum"] / max(stats["scored_tokens"], 1.0),
        "glancing_ratio": stats["glancing_ratio"],
        "glanced": int(stats["glanced"]),
    }


GLAT = Objective(
    name="glat",
    architecture="nat",
    step=step,
    statistics=("nll_sum", "scored_tokens", "glanced"),
    log=log,
    glancing="0.5:0.3@300k",  # GLAT's schedule: 0.5 annealed to 0.3 over 300k updates
)
