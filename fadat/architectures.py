"""The translation-model interface and the registry of architectures.

Every architecture (``model_type`` in a model directory's config.json) is one ``nn.Module``
class that implements :class:`TranslationModel`. ``fadat translate``, ``score``, ``evaluate``,
the trainer's validation and the Python API (:class:`fadat.translate.Translator`) talk to a
model only through this interface; none of them names an architecture. To add one, write its
class in one file and add one line to :data:`ARCHITECTURES` (docs/extending.md).

The registry maps a name to ``"module:Class"`` and imports the module on first use, so that
reading a config does not import every network.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from fadat.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

    from fadat.transformer import ModelConfig

#: ``model_type`` → ``"module:Class"`` of the network that implements :class:`TranslationModel`.
ARCHITECTURES: dict[str, str] = {
    "dat": "fadat.model:DATModel",
    "at": "fadat.baseline:ATModel",
    "nat": "fadat.nat:NATModel",
    "ctc": "fadat.ctc:CTCModel",
}

#: One hypothesis: ``(token ids without <s>/</s>/<pad>, score in nats)``.
Scored = tuple[list[int], float]


class BatchScores(NamedTuple):
    """``log P(y|x)`` of a batch of (source, target) pairs (:meth:`TranslationModel.score_batch`).

    Attributes:
        log_probs: per pair, ``log P(y|x)`` in nats (``-inf`` or NaN when the model cannot
            score the target, with the reason in ``problems``).
        tokens: per pair, the number of tokens ``log_prob`` covers.
        problems: per pair, ``None`` or a message saying why the pair was not (fully) scored.
    """

    log_probs: list[float]
    tokens: list[int]
    problems: list[str | None]


@runtime_checkable
class TranslationModel(Protocol):
    """What translate / score / evaluate / serve need from a model.

    Tensors follow the data contract (:mod:`fadat.data.contract`): ``source`` is ``(B, S)``
    int64 ``x </s>`` right-padded with ``<pad>``; ``target`` is ``(B, T)`` int64
    ``<s> y </s>`` right-padded.

    Attributes:
        config: the model's :class:`~fadat.transformer.ModelConfig`.
        metadata: the non-config entries of config.json (after loading), else ``{}``.
        model_type: the registry name (``ARCHITECTURES`` key).
        default_strategy: the strategy used when none is given.
        validation_strategy: the strategy the trainer's validation BLEU decodes with.
        autoregressive: ``fadat evaluate`` runs an autoregressive model as the paper's AT
            baseline (greedy and beam search with ``--at-*`` settings), a non-autoregressive
            one with ``--strategies``.
        flag_aliases: per strategy, CLI option name → the strategy's keyword, where they differ
            (the DAG beam search calls ``--length-penalty`` ``alpha``).
    """

    config: ModelConfig
    metadata: dict[str, Any]
    model_type: ClassVar[str]
    default_strategy: ClassVar[str]
    validation_strategy: ClassVar[str]
    autoregressive: ClassVar[bool]
    flag_aliases: ClassVar[dict[str, dict[str, str]]]

    def strategies(self) -> dict[str, tuple[str, ...]]:
        """Strategy name → the keyword options it accepts."""
        ...

    def check_options(self, strategy: str, options: dict[str, Any], nbest: int = 1) -> None:
        """Validate option values and ``nbest`` for a known strategy (raise ValueError with the
        decoder's message; callers turn it into an InputError)."""
        ...

    def translate_batch(
        self, source: Tensor, strategy: str, options: dict[str, Any], nbest: int = 1
    ) -> list[list[Scored]]:
        """Decode a batch: per sentence up to ``nbest`` ``(tokens, score)``, best first."""
        ...

    def score_batch(self, source: Tensor, target: Tensor, target_lengths: Tensor) -> BatchScores:
        """``log P(y|x)`` of each pair of the batch (``target_lengths`` ``(B,)`` int64 = T_b)."""
        ...

    def batch_cost(self, source_length: int) -> int:
        """Padded positions one sentence of ``source_length`` tokens (with ``</s>``) occupies in
        an inference batch (the budget of ``--max-tokens``)."""
        ...

    def length_budget(self) -> tuple[float, int | None]:
        """``(ratio, max positions)`` that training's token budget counts a sentence with:
        the graph size ``min(ratio·|x|, max)`` of a non-autoregressive decoder, or ``(1, None)``
        for target tokens."""
        ...

    def usable(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
        """``(N,)`` bool: which training pairs the model can take (positions tables)."""
        ...


def model_class(model_type: str) -> type:
    """The class registered for ``model_type`` (imports its module).

    Raises:
        InputError: unknown ``model_type`` (the training config and the model directory's
            reader check the name first, with the file or flag it came from).
    """
    if model_type not in ARCHITECTURES:
        raise InputError(f"model_type must be one of {tuple(ARCHITECTURES)}, got {model_type!r}")
    module, _, name = ARCHITECTURES[model_type].partition(":")
    return getattr(importlib.import_module(module), name)
