"""Training objectives behind one small interface (:class:`~fadat.objectives.base.Objective`),
registered by name in :data:`OBJECTIVES`; the trainer names none of them.

- ``nll``: the DAG negative log-likelihood with glancing and force-emit (DA-Transformer);
- ``fuzzy``: FA-DAT's fuzzy alignment loss;
- ``label_smoothed_ce``: the autoregressive baseline's label-smoothed cross-entropy.

To add an objective: one file under ``fadat/objectives/`` defining an ``Objective`` (its step,
frozen options dataclass, statistics and log fields) and one line in :data:`REGISTRY`
(docs/extending.md). What several objectives share: the loss math (:mod:`.losses`: reference
log-probabilities from logits, the DAG NLL, the fuzzy loss, label-smoothed CE) and glancing
(:mod:`.glancing`: the schedule and the glancing pass).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from fadat.data.contract import Batch
from fadat.objectives.base import Objective, Option
from fadat.objectives.losses import LossOutput

#: name → ``"module:attribute"`` of its :class:`Objective`: one line per objective, imported
#: only when :data:`OBJECTIVES` is asked for it.
REGISTRY: dict[str, str] = {
    "nll": "fadat.objectives.dat:NLL",
    "fuzzy": "fadat.objectives.dat:FUZZY",
    "label_smoothed_ce": "fadat.objectives.at:LABEL_SMOOTHED_CE",
    "nat": "fadat.objectives.nat:NAT",
    "glat": "fadat.objectives.glat:GLAT",
    "ctc": "fadat.objectives.ctc:CTC",
}


class _LazyObjectives(Mapping[str, Objective]):
    """:data:`REGISTRY` as ``name → Objective``, importing an objective's module on first use
    (its names and their order need no import)."""

    def __init__(self, registry: dict[str, str]) -> None:
        self._registry = registry
        self._loaded: dict[str, Objective] = {}

    def __getitem__(self, name: str) -> Objective:
        if name not in self._loaded:
            module, attribute = self._registry[name].split(":")  # KeyError: unknown name
            objective = getattr(importlib.import_module(module), attribute)
            if objective.name != name:
                raise ValueError(f"REGISTRY[{name!r}] is the objective {objective.name!r}")
            self._loaded[name] = objective
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry)

    def __len__(self) -> int:
        return len(self._registry)


#: name → objective (a read-only mapping over :data:`REGISTRY`, loaded lazily).
OBJECTIVES: Mapping[str, Objective] = _LazyObjectives(REGISTRY)


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


@dataclass(frozen=True)
class ObjectiveConfig:
    """The settings of one update that a step reads, e.g. ``ObjectiveConfig("fuzzy", 0.1,
    FuzzyOptions(ngram_order=2))``.

    Attributes:
        name: the objective (a key of :data:`OBJECTIVES`).
        glancing_ratio: the scheduled glancing ratio of this update (0 = no glancing).
        options: the objective's options dataclass (``Objective.options_class``); ``None`` is
            replaced by its defaults (and stays ``None`` for an objective without options or an
            unknown name, which :func:`compute_loss` rejects).
    """

    name: str
    glancing_ratio: float = 0.0
    options: Any = None

    def __post_init__(self) -> None:
        objective = OBJECTIVES.get(self.name)
        if self.options is None and objective is not None and objective.options_class:
            object.__setattr__(self, "options", objective.options_class())


def compute_loss(
    model: nn.Module, batch: Batch, cfg: ObjectiveConfig, objective: Objective | None = None
) -> LossOutput:
    """Forward ``batch`` through ``model`` and apply the objective ``cfg.name``.

    Args:
        model: the unwrapped model, in train or eval mode.
        batch: a :class:`~fadat.data.contract.Batch` with targets, on the model's device.
        cfg: the update's :class:`ObjectiveConfig`.
        objective: ``OBJECTIVES[cfg.name]`` when the caller resolved it once (the trainer: once
            per run, not per micro-batch); looked up here when ``None``.

    Returns:
        :class:`~fadat.objectives.losses.LossOutput` (``loss_sum`` carries the gradient).

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
    "REGISTRY",
    "Objective",
    "ObjectiveConfig",
    "Option",
    "all_options",
    "compute_loss",
    "default_objective",
]
