"""The vanilla NAT's objective (``nat``, trains ``--arch nat``, :mod:`fadat.models.nat`):
label-smoothed position-wise cross-entropy at the ``<unk>`` positions plus the length predictor's
cross-entropy (:func:`fadat.models.nat.nat_loss`), per-sentence means averaged over sentences."""

from __future__ import annotations

from typing import Any

from torch import nn

from fadat.data.contract import Batch
from fadat.models.nat import nat_loss
from fadat.objectives.base import Objective
from fadat.objectives.losses import LossOutput


def step(model: nn.Module, batch: Batch, settings: Any) -> LossOutput:
    """One micro-batch (``count`` = sentences; no glancing: that is ``glat``)."""
    losses, stats = nat_loss(model, batch.source, batch.target, batch.target_lengths)
    stats["target_tokens"] = float(batch.target_lengths.sum())
    stats["sentences"] = float(len(batch))
    return LossOutput(loss_sum=losses.sum(), count=len(batch), stats=stats)


def log(stats: dict[str, float]) -> dict[str, Any]:
    """The token NLL per scored position (nats), without label smoothing or length loss."""
    return {"nll": stats["nll_sum"] / max(stats["scored_tokens"], 1.0)}


NAT = Objective(
    name="nat",
    architecture="nat",
    step=step,
    statistics=("nll_sum", "scored_tokens"),
    log=log,
    default_for=True,
)
