"""The objective interface: what an objective declares (:class:`Objective`, :class:`Option`) and
the per-update settings its step receives. The registry is :data:`fadat.objectives.OBJECTIVES`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fadat.data.contract import Batch
from fadat.objectives.losses import LossOutput


@dataclass(frozen=True)
class Option:
    """A training option an objective reads: a key of the training config (YAML key, field of
    :class:`fadat.training.config.TrainConfig`) and a ``fadat train`` flag.

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

    @classmethod
    def from_field(cls, f: dataclasses.Field, hint: type) -> Option:
        """The option of one field of an objective's options dataclass (:func:`option`)."""
        return cls(
            f.name,
            hint,
            f.default,
            f.metadata.get("help", ""),
            f.metadata.get("check"),
            f.metadata.get("problem", ""),
        )

    @property
    def flag(self) -> str:
        """``--ngram-order``; ``--no-force-emit`` for a boolean that defaults to true."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.type is bool and self.default else f"--{dashed}"


def option(
    default: Any, help: str, check: Callable[[Any], bool] | None = None, problem: str = ""
) -> Any:
    """A field of an objective's options dataclass: its default, the flag's help text and the
    check (``value -> ok``, rejected with ``problem``) kept in the field's metadata, e.g.
    ``ngram_order: int = option(2, "n of the fuzzy loss", lambda v: v >= 1, "must be >= 1")``."""
    return dataclasses.field(
        default=default, metadata={"help": help, "check": check, "problem": problem}
    )


def options_of(options_class: type | None) -> tuple[Option, ...]:
    """The :class:`Option` of every field of an objective's frozen options dataclass (``()``
    for ``None``: an objective without options).

    Raises:
        TypeError: a field without a default (every option needs one) or of another type than
            ``bool``, ``int``, ``float`` or ``str``.
    """
    if options_class is None:
        return ()
    hints = typing.get_type_hints(options_class)
    out = []
    for f in dataclasses.fields(options_class):
        if f.default is dataclasses.MISSING or hints[f.name] not in (bool, int, float, str):
            raise TypeError(
                f"{options_class.__name__}.{f.name}: an option needs a default and the type "
                "bool, int, float or str"
            )
        out.append(Option.from_field(f, hints[f.name]))
    return tuple(out)


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
        architecture: the ``model_type`` it trains
            (:data:`fadat.models.architectures.ARCHITECTURES`).
        step: ``(model, batch, settings) -> LossOutput``: forward one micro-batch and compute the
            loss (``settings`` is a :class:`fadat.objectives.ObjectiveConfig`).
        count: the normaliser of a micro-batch from its sentences' target lengths
            (:func:`sentence_count` or :func:`token_count`).
        options_class: its frozen options dataclass (fields made with :func:`option`; ``None``
            for none): each field is a config key and a ``fadat train`` flag. Two objectives
            that read the same key declare it with the same type and default.
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
    options_class: type | None = None
    statistics: tuple[str, ...] = ()
    log: Callable[[dict[str, float]], dict[str, Any]] = lambda stats: {}
    glancing: str = "0"
    default_for: bool = False

    @property
    def options(self) -> tuple[Option, ...]:
        """The config keys it reads (:func:`options_of` its ``options_class``)."""
        return options_of(self.options_class)
