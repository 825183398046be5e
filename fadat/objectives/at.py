"""The autoregressive baseline's objective: label-smoothed cross-entropy with teacher forcing
(``<s> y`` → ``y </s>``), normalised per target token, as fairseq's
``label_smoothed_cross_entropy``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from fadat.data.contract import PAD_ID, Batch
from fadat.objectives.base import Objective, option, token_count
from fadat.objectives.glancing import no_autocast
from fadat.objectives.losses import LossOutput, label_smoothed_nll, widen


@dataclass(frozen=True)
class LabelSmoothedCEOptions:
    """Options of ``label_smoothed_ce``."""

    label_smoothing: float = option(
        0.1,
        "label smoothing of --arch at (0.1)",
        lambda v: 0 <= v < 1,
        "label_smoothing must be in [0, 1)",
    )


def step(model: nn.Module, batch: Batch, settings: Any) -> LossOutput:
    """Teacher-forced label-smoothed CE of one micro-batch (``count`` = target tokens)."""
    prev = batch.target[:, :-1]  # (B, T−1): <s> y
    gold = batch.target[:, 1:]  # (B, T−1): y </s>
    token_logprobs = model(batch.source, prev)  # (B, T−1, V)
    with no_autocast(token_logprobs.device):
        smoothing = settings.options.label_smoothing
        loss, nll = label_smoothed_nll(widen(token_logprobs), gold, smoothing)
    ntokens = int((gold != PAD_ID).sum())
    stats = {
        "nll_sum": float(nll.detach().sum()),
        "target_tokens": float(batch.target_lengths.sum()),
        "sentences": float(len(batch)),
    }
    return LossOutput(loss_sum=loss.sum(), count=ntokens, stats=stats)


LABEL_SMOOTHED_CE = Objective(
    name="label_smoothed_ce",
    architecture="at",
    step=step,
    count=token_count,
    options_class=LabelSmoothedCEOptions,
    statistics=("nll_sum",),
    log=lambda stats: {"nll": stats["nll_sum"] / max(stats["count"], 1.0)},
    default_for=True,
)
