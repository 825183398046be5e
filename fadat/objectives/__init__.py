"""Training objectives behind one small interface (:class:`~fadat.objectives.base.Objective`),
registered by name in :data:`OBJECTIVES`; the trainer names none of them.

- ``nll``: the DAG negative log-likelihood with glancing and force-emit (DA-Transformer);
- ``fuzzy``: FA-DAT's fuzzy alignment loss;
- ``label_smoothed_ce``: the autoregressive baseline's label-smoothed cross-entropy.

To add an objective: one file under ``fadat/objectives/`` defining an ``Objective`` (its step,
frozen options dataclass, statistics and log fields) and one line in :data:`OBJECTIVES`
(docs/extending.md).
"""

from __future__ import annotations

import dataclasses

from torch import nn

from fadat.data.contract import Batch
from fadat.losses import LossOutput
from fadat.objectives import at, ctc, dat, glat, nat
from fadat.objectives.base import Objective, Option

#: name → objective.
OBJECTIVES: dict[str, Objective] = {
    "nll": dat.NLL,
    "fuzzy": dat.FUZZY,
    "label_smoothed_ce": at.LABEL_SMOOTHED_CE,
    "nat": nat.NAT,
    "glat": glat.GLAT,
    "ctc": ctc.CTC,
}


def all_options() -> tuple[Option, ...]:
    """The options of every registered objective, each once, in registry order.

    Raises:
        ValueError: two objectives declare one name with different types or defaults.
    """
    seen: dict[str, Option] = {}
    for objective in OBJECTIVES.values():
        for option in objective.options:
            first = seen.setdefault(option.name, option)
            if (first.type, first.default) != (option.type, option.default):
                raise ValueError(f"two objectives declare different options {option.name!r}")
    return tuple(seen.values())


def default_objective(architecture: str) -> str:
    """The objective that trains ``architecture`` when none is named ("" if there is none)."""
    return next(
        (o.name for o in OBJECTIVES.values() if o.default_for and o.architecture == architecture),
        "",
    )


#: The settings of one update that a step reads: ``name``, the scheduled ``glancing_ratio`` and
#: every objective option (:func:`all_options`) with its default, e.g.
#: ``ObjectiveConfig(name="fuzzy", glancing_ratio=0.1, ngram_order=2)``.
ObjectiveConfig = dataclasses.make_dataclass(
    "ObjectiveConfig",
    [("name", str), ("glancing_ratio", float, dataclasses.field(default=0.0))]
    + [(o.name, o.type, dataclasses.field(default=o.default)) for o in all_options()],
    frozen=True,
    namespace={"__module__": __name__},
)


def compute_loss(
    model: nn.Module, batch: Batch, cfg: ObjectiveConfig, objective: Objective | None = None
) -> LossOutput:
    """Forward ``batch`` through ``model`` and apply the objective ``cfg.name``.

    Args:
        model: the unwrapped model, in train or eval mode.
        batch: a :class:`~fadat.data.contract.Batch` with targets, on the model's device.
        cfg: the update's :data:`ObjectiveConfig`.
        objective: ``OBJECTIVES[cfg.name]`` when the caller resolved it once (the trainer: once
            per run, not per micro-batch); looked up here when ``None``.

    Returns:
        :class:`~fadat.losses.LossOutput` (``loss_sum`` carries the gradient).

    Raises:
        ValueError: unknown objective name.
    """
    if objective is not None:
        return objective.step(model, batch, cfg)
    if cfg.name not in OBJECTIVES:
        raise ValueError(f"unknown objective {cfg.name!r}; choose from {sorted(OBJECTIVES)}")
    return OBJECTIVES[cfg.name].step(model, batch, cfg)


__all__ = [
    "OBJECTIVES",
    "Objective",
    "ObjectiveConfig",
    "Option",
    "all_options",
    "compute_loss",
    "default_objective",
]
