"""The objective interface: what an objective declares (:class:`Objective`, :class:`Option`) and
the per-update settings its step receives. The registry is :data:`fadat.objectives.OBJECTIVES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fadat.data.contract import Batch
from fadat.losses import LossOutput


@dataclass(frozen=True)
class Option:
    """A training option an objective reads: a key of the training config (YAML key, field of
    :class:`fadat.train_config.TrainConfig`) and a ``fadat train`` flag.

    Attributes:
        name: the config key.
        type: ``bool``, ``int``, ``float`` or ``str``.
        default: its default value.
        help: the flag's help text.
        check: ``value -> ok``; the config is rejected with ``problem`` when it returns False.
        problem: the message for a rejected value.
    """

    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    problem: str = ""

    @property
    def flag(self) -> str:
        """``--ngram-order``; ``--no-force-emit`` for a boolean that defaults to true."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.type is bool and self.default else f"--{dashed}"


def sentence_count(target_lengths: Sequence[int]) -> int:
    """Normalise by sentences (the DAG objectives: per-sentence means)."""
    return len(target_lengths)


def token_count(target_lengths: Sequence[int]) -> int:
    """Normalise by predicted target tokens ``|y </s>|`` (the cross-entropy)."""
    return sum(int(t) - 1 for t in target_lengths)


@dataclass(frozen=True)
class Objective:
    """A training objective, registered by name in :data:`fadat.objectives.OBJECTIVES`.

    The trainer knows objectives only through these fields: it builds the step's settings from
    ``options`` (plus the scheduled glancing ratio), divides the update's summed ``loss_sum`` by
    the summed ``count``, sums ``statistics`` over micro-batches and ranks, and writes what
    ``log`` makes of them into train_log.jsonl.

    Attributes:
        name: the registry key (``--objective``).
        architecture: the ``model_type`` it trains (:data:`fadat.architectures.ARCHITECTURES`).
        step: ``(model, batch, settings) -> LossOutput``: forward one micro-batch and compute the
            loss (``settings`` is a :class:`fadat.objectives.ObjectiveConfig`).
        count: the normaliser of a micro-batch from its sentences' target lengths
            (:func:`sentence_count` or :func:`token_count`).
        options: the config keys it reads (shared options are the same :class:`Option` object).
        statistics: the additive statistics its step returns in ``LossOutput.stats`` (besides
            ``sentences`` and ``target_tokens``, which every step returns).
        log: ``(summed statistics, also "count", "sentences", "glancing_ratio") -> fields`` added
            to the update's log record.
        glancing: the default glancing schedule (``--glat-p``) of this objective; ``"0"`` = none.
        default_for: the objective ``--arch`` trains when no ``--objective`` is given.
    """

    name: str
    architecture: str
    step: Callable[[nn.Module, Batch, Any], LossOutput]
    count: Callable[[Sequence[int]], int] = sentence_count
    options: tuple[Option, ...] = ()
    statistics: tuple[str, ...] = ()
    log: Callable[[dict[str, float]], dict[str, Any]] = lambda stats: {}
    glancing: str = "0"
    default_for: bool = False
