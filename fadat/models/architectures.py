"""The translation-model interface and the registry of architectures.

Every architecture (``model_type`` in a model directory's config.json) is one subclass of
:class:`TranslationModel`, an abstract ``nn.Module`` with defaults. ``fadat translate``,
``score``, ``evaluate``, ``serve``, the trainer's validation and the Python API
(:class:`fadat.translation.translator.Translator`) talk to a model only through this interface and
its capabilities (``has_graph``, ``precisions``, ``reduced_head``, ...); none of them names an
architecture. To add one, write its class in one file and add one line to
:data:`ARCHITECTURES` (docs/extending.md).

The registry maps a name to ``"module:Class"`` and imports the module on first use, so that
reading a config does not import every network.
"""

from __future__ import annotations

import abc
import importlib
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np
from torch import Tensor, nn

from fadat.data.contract import Batch, drawn_graph_size, graph_size, uniform_draws
from fadat.decoding.strategies import POSITIONS, Strategy, StrategyError, offered
from fadat.errors import InputError, NonFiniteOutputError

if TYPE_CHECKING:
    from fadat.models.config import ModelConfig
    from fadat.models.transformer import EncoderOut

#: ``model_type`` → ``"module:Class"`` of the network that implements :class:`TranslationModel`.
ARCHITECTURES: dict[str, str] = {
    "dat": "fadat.models.dat:DATModel",
    "at": "fadat.models.at:ATModel",
    "nat": "fadat.models.nat:NATModel",
    "ctc": "fadat.models.ctc:CTCModel",
}


class Scored(NamedTuple):
    """One hypothesis of :meth:`TranslationModel.translate_batch`.

    Attributes:
        tokens: output token ids without ``<s>``/``</s>``/``<pad>``.
        score: the strategy's score in nats.
        log_prob: ``log P(y|x)`` of ``tokens`` in nats, as :meth:`TranslationModel.score_batch`
            gives it, computed from the same forward pass as the translation; ``None`` unless
            ``translate_batch`` was asked for it (``with_log_prob``), or where the model cannot
            give it from that pass (see each model's ``translate_batch``).
        covers: the number of tokens ``log_prob`` covers (:attr:`BatchScores.tokens`).
    """

    tokens: list[int]
    score: float
    log_prob: float | None
    covers: int


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


class TranslationModel(nn.Module, metaclass=abc.ABCMeta):
    """What translate / score / evaluate / serve / validation need from a model: an abstract base
    with defaults (the shape of sacrebleu's ``Metric``).

    A subclass sets :attr:`model_type` and writes :meth:`translate_batch` and
    :meth:`score_batch`; everything else has a default that describes a non-autoregressive model
    over ``L = λ·|x </s>|`` positions (:meth:`graph_lengths`) decoded by one strategy
    ``argmax`` without options, built on :class:`fadat.models.transformer.Encoder`
    (``self.encoder``). The CTC model overrides nothing else; the NAT its sizes; the DAT its
    strategies and capabilities; the AT both. Callers branch on the capabilities below, never on the
    class or ``model_type``.

    Tensors follow the data contract (:mod:`fadat.data.contract`): ``source`` is ``(B, S)``
    int64 ``x </s>`` right-padded with ``<pad>``; ``target`` is ``(B, T)`` int64
    ``<s> y </s>`` right-padded.

    Attributes:
        config: the model's :class:`~fadat.models.config.ModelConfig`.
        metadata: the non-config entries of config.json (after loading), else ``{}``.
        model_type: the registry name (``ARCHITECTURES`` key).
        default_strategy: the strategy used when none is given.
        validation_strategy: the strategy the trainer's validation BLEU decodes with.
        validation_options: that strategy's keyword → the ``TrainConfig`` field that sets it in
            validation (the DAT's ``beta`` is ``decode_beta``).
        autoregressive: ``fadat evaluate`` runs an autoregressive model as the paper's AT
            baseline (greedy and beam search with ``--at-*`` settings), a non-autoregressive
            one with ``--strategies``.
        flag_aliases: per strategy, CLI option name → the strategy's keyword, where they differ
            (the DAG beam search calls ``--length-penalty`` ``alpha``).
        decoder_kind: what its decoder gives the strategies to read
            (:data:`fadat.decoding.strategies.DECODER_KINDS`: ``graph``, ``autoregressive``,
            ``positions``); it offers the strategies of the registry that need it
            (:meth:`offered_strategies`).
        upsampled: its decoder length is ``λ·|x </s>|`` (DAT, CTC), so it takes a decoding λ
            (``upsample_ratio``); the AT and the NAT, which would ignore one, refuse it
            (:func:`fadat.translation.pipeline.check_upsample_ratio`).
        has_graph: the outputs are a DAG (``graph_outputs``) that ``fadat analyze``, ``fadat
            show-graph`` and the server's graph view can draw.
        precisions: the inference precisions of :func:`fadat.models.inference.with_precision` it
            runs in (``--precision``).
        reduced_head: takes a vocabulary shortlist and vertex pruning (``--shortlist``,
            ``--prune-threshold``; :func:`fadat.models.inference.with_reduced_head`).
        renamed_parameters: parameter-name prefixes of earlier versions → today's; state dicts
            with the old names (model directories, checkpoints) load (:meth:`upgrade_state_dict`).
    """

    model_type: ClassVar[str]
    default_strategy: ClassVar[str] = "argmax"
    validation_strategy: ClassVar[str] = "argmax"
    validation_options: ClassVar[dict[str, str]] = {}
    autoregressive: ClassVar[bool] = False
    flag_aliases: ClassVar[dict[str, dict[str, str]]] = {}
    decoder_kind: ClassVar[str] = POSITIONS
    upsampled: ClassVar[bool] = True
    has_graph: ClassVar[bool] = False
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    reduced_head: ClassVar[bool] = False
    renamed_parameters: ClassVar[dict[str, str]] = {}

    config: ModelConfig
    metadata: dict[str, Any]

    def __init__(self, config: ModelConfig) -> None:
        """Check ``config.model_type`` and keep the config; subclasses then build the network.

        Raises:
            InputError: ``config`` is for another architecture.
        """
        super().__init__()
        if config.model_type != self.model_type:
            raise InputError(
                f"{type(self).__name__} needs model_type {self.model_type!r}, "
                f"got {config.model_type!r}"
            )
        self.config = config
        self.metadata = {}
        if self.renamed_parameters:
            self.register_load_state_dict_pre_hook(_rename_on_load)

    # ---- the network (defaults for models built on fadat.models.transformer.Encoder)

    @property
    def output_weight(self) -> Tensor:
        """``(V, d)`` the bias-free output projection, tied to the shared token embedding."""
        return self.encoder.embed_tokens.weight

    def encode(self, source: Tensor) -> EncoderOut:
        """Run the encoder on ``source`` ``(B, S)`` int64
        (:meth:`fadat.models.transformer.Encoder.forward`)."""
        return self.encoder(source)

    def graph_lengths(
        self, source_lengths: Tensor, decoding: bool = False, upsample_ratio: float | None = None
    ) -> Tensor:
        """Decoder sizes ``L_b = clip(int(λ·|x </s>|), 2, max_target_positions)``
        (docs/reference-behaviour.md, "Graph size"; :func:`fadat.data.contract.graph_size`).

        Args:
            source_lengths: ``(B,)`` int64 source lengths including ``</s>``.
            decoding: use ``decode_upsample_ratio`` instead of ``upsample_ratio``.
            upsample_ratio: λ given by the caller (``--upsample-ratio``), used instead of
                either of the config's; ``None`` = the config's.

        Returns:
            ``(B,)`` int64 on the device of ``source_lengths``.

        Raises:
            ValueError: ``upsample_ratio <= 0`` (:func:`fadat.data.contract.graph_size`).
        """
        ratio = self.config.decoding_upsample_ratio if decoding else self.config.upsample_ratio
        ratio = ratio if upsample_ratio is None else upsample_ratio
        sizes = graph_size(source_lengths, ratio, max_positions=self.config.max_target_positions)
        return sizes.to(source_lengths.device) if isinstance(source_lengths, Tensor) else sizes

    def training_graph_lengths(self, batch: Batch, seed: int, update: int) -> Tensor | None:
        """The graph sizes of a training batch drawn from ``config.upsample_ratio_range``
        (DA-Transformer v2's ``--upsample-scale a~b``), or ``None`` for a model with a fixed λ
        (its step then sizes the graph with :meth:`graph_lengths`).

        Each sentence's λ is uniform in ``[a, b]``, a pure function of ``(seed, update,
        sentence id)`` (:func:`fadat.data.contract.uniform_draws`: no generator state, so a
        resumed run draws what the uninterrupted one drew); the size is raised to the target
        length where smaller and clipped to ``max_target_positions``
        (:func:`fadat.data.contract.drawn_graph_size`).

        Args:
            batch: a training batch with targets (``ids`` are the split's sentence indices).
            seed: the run's seed.
            update: the 0-based index of the update being computed.

        Returns:
            ``(B,)`` int64 on the device of ``batch.source_lengths``, or ``None``.
        """
        ratio_range = getattr(self.config, "upsample_ratio_range", None)
        if ratio_range is None:
            return None
        return drawn_graph_size(
            batch.source_lengths,
            batch.target_lengths,
            ratio_range,
            uniform_draws(seed, update, batch.ids),
            self.config.max_target_positions,
        )

    @classmethod
    def upgrade_state_dict(cls, state: Mapping[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
        """``state`` with the parameter names of earlier versions (:attr:`renamed_parameters`,
        after ``prefix``) renamed to today's; other names unchanged."""
        out = {}
        for name, value in state.items():
            for old, new in cls.renamed_parameters.items():
                if name.startswith(prefix + old):
                    name = prefix + new + name[len(prefix + old) :]
                    break
            out[name] = value
        return out

    # ---- decoding and scoring

    @classmethod
    def offered_strategies(cls) -> dict[str, Strategy]:
        """The strategies it offers, name → record: those of the registry that need its
        :attr:`decoder_kind` (:func:`fadat.decoding.strategies.offered`; default ``argmax``)."""
        return offered(cls.decoder_kind)

    def strategies(self) -> dict[str, tuple[str, ...]]:
        """Strategy name → the keyword options it accepts (of :meth:`offered_strategies`)."""
        return {name: s.option_names for name, s in self.offered_strategies().items()}

    def check_options(self, strategy: str, options: dict[str, Any], nbest: int = 1) -> None:
        """Validate option values and ``nbest`` for a strategy it offers, from the strategy's
        record (:meth:`fadat.decoding.strategies.Strategy.check_request`; no decode is tried).

        Raises:
            StrategyError: (a ``ValueError``) a strategy it does not offer, an option the
                strategy does not take, a value of the wrong type or out of range, or an
                ``nbest`` the strategy cannot give.
        """
        record = self.offered_strategies().get(strategy)
        if record is None:
            raise StrategyError(
                f"strategy {strategy!r} is not available for {self.model_type.upper()} models; "
                f"choose one of {', '.join(self.offered_strategies())}"
            )
        record.check_request(options, nbest)

    @abc.abstractmethod
    def translate_batch(
        self,
        source: Tensor,
        strategy: str,
        options: dict[str, Any],
        nbest: int = 1,
        *,
        upsample_ratio: float | None = None,
        with_log_prob: bool = False,
    ) -> list[list[Scored]]:
        """Decode a batch: per sentence up to ``nbest`` :class:`Scored`, best first.

        ``upsample_ratio``: the decoding λ of a model whose decoder length is ``λ·|x|``
        (``None`` = the model's; a model without :attr:`upsampled` ignores it here, and the
        pipeline refuses one for it before any input is read). ``with_log_prob``: fill
        :attr:`Scored.log_prob` from the same pass (opt-in: it may cost more than the
        translation, e.g. the full token head of a DAT's fast path).

        Raises :class:`~fadat.errors.NonFiniteOutputError` (:func:`check_finite`) when the
        network's outputs for a row are NaN or +inf, before any decoder or the ``log P(y|x)``
        of the outputs reads them."""

    @abc.abstractmethod
    def score_batch(
        self,
        source: Tensor,
        target: Tensor,
        target_lengths: Tensor,
        *,
        upsample_ratio: float | None = None,
    ) -> BatchScores:
        """``log P(y|x)`` of each pair of the batch (``target_lengths`` ``(B,)`` int64 = T_b), on
        the decoder that translation runs at λ = ``upsample_ratio``.

        Raises :class:`~fadat.errors.NonFiniteOutputError` as :meth:`translate_batch`."""

    # ---- batching

    def batch_cost(self, source_length: int, upsample_ratio: float | None = None) -> int:
        """Padded positions one sentence of ``source_length`` tokens (with ``</s>``) occupies in
        an inference batch (the budget of ``--max-tokens``) at λ = ``upsample_ratio``
        (``None`` = the model's decoding λ); default: its decoding size ``L`` (the
        ``(B, L, V)`` log-probs dominate memory)."""
        ratio = self.config.decoding_upsample_ratio if upsample_ratio is None else upsample_ratio
        return int(graph_size(source_length, ratio, self.config.max_target_positions))

    def length_budget(self) -> tuple[float, int | None]:
        """``(ratio, max positions)`` that training's token budget counts a sentence with:
        the graph size ``min(ratio·|x|, max)`` of a non-autoregressive decoder, or ``(1, None)``
        for target tokens. Default ``(λ, max_target_positions)``: decoder positions; for a model
        trained over a λ range ``(b, max_target_positions)`` with ``b`` the range's top, an
        upper bound of every drawn size (a drawn size raised to the target length is covered by
        the budget's ``max(source, target, graph)``), so ``--max-tokens`` still bounds the
        padded decoder positions of a batch."""
        ratio_range = getattr(self.config, "upsample_ratio_range", None)
        ratio = self.config.upsample_ratio if ratio_range is None else max(ratio_range)
        return ratio, self.config.max_target_positions

    def usable(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
        """``(N,)`` bool: which training pairs the model can take. Default: sources within
        ``max_source_positions`` (a target longer than the decoder is not dropped: the loss
        counts it as invalid, as the reference does)."""
        return np.asarray(source_lengths) <= self.config.max_source_positions


def _rename_on_load(
    module: TranslationModel, state_dict: dict[str, Tensor], prefix: str, *args: Any
) -> None:
    """``load_state_dict`` pre-hook: rename the parameters of earlier versions in place."""
    upgraded = module.upgrade_state_dict(state_dict, prefix)
    state_dict.clear()
    state_dict.update(upgraded)


def model_class(model_type: str) -> type[TranslationModel]:
    """The class registered for ``model_type`` (imports its module).

    Raises:
        InputError: unknown ``model_type`` (the training config and the model directory's
            reader check the name first, with the file or flag it came from).
    """
    if model_type not in ARCHITECTURES:
        raise InputError(f"model_type must be one of {tuple(ARCHITECTURES)}, got {model_type!r}")
    module, _, name = ARCHITECTURES[model_type].partition(":")
    return getattr(importlib.import_module(module), name)


def check_finite(tensor: Tensor, what: str, rows: Sequence[int] | None = None) -> Tensor:
    """Refuse a model's inference outputs that hold NaN or +inf; return ``tensor`` unchanged.

    Called where a model's inference path has its network outputs (before a decoder or a
    likelihood reads them), never in training, whose non-finite losses are counted by the
    trainer instead. −inf is allowed: it is the log-probability of what cannot happen (invalid
    links, padding rows, pruned vertices).

    Cost: one reduction over a tensor the forward pass produced anyway (``amax`` propagates
    NaN, so ``amax < inf`` is false exactly when a NaN or a +inf is present); the rows are
    located only when the check fails.

    Args:
        tensor: ``(B, ...)`` float log-probabilities or scores, any dtype and device.
        what: what they are, for the message (``"link scores"``).
        rows: the batch row of each of ``tensor``'s rows (a beam search's live sentences);
            default ``0, 1, …``.

    Returns:
        ``tensor``.

    Raises:
        NonFiniteOutputError: naming ``what`` and the affected rows of the batch.
    """
    if tensor.numel() == 0 or bool(tensor.amax() < math.inf):
        return tensor
    bad = tensor.isnan() | tensor.isposinf()
    found = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[:, 0].tolist()
    raise NonFiniteOutputError(what, found if rows is None else [rows[r] for r in found])


@contextmanager
def naming_inputs(model: nn.Module, lines: list[int]) -> Iterator[None]:
    """Around one batch of a model's batch methods: a :class:`NonFiniteOutputError` raised
    inside is raised again naming the model directory (``model.directory``, set by
    :func:`fadat.models.directory.load_pretrained`) and the input lines of its rows.

    An int8 model (:func:`fadat.models.inference.with_precision`) fails earlier, inside the forward
    pass: torch's dynamic quantization raises ``RuntimeError`` ("In ChooseQuantizationParams,
    min should be less than or equal to max") for activations that are NaN; that becomes a
    :class:`NonFiniteOutputError` for the whole batch.

    Args:
        model: the model the batch runs on.
        lines: the 1-based input line of each row of the batch.
    """
    directory = getattr(model, "directory", None)
    where = None if directory is None else str(directory)
    try:
        yield
    except NonFiniteOutputError as err:
        if err.lines is not None:  # located by an inner batch loop already
            raise
        raise err.located(where, lines) from None
    except RuntimeError as err:
        if "ChooseQuantizationParams" not in str(err):
            raise
        error = NonFiniteOutputError("activations (int8)").located(where, lines)
        raise error from None
