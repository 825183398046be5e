"""The engine a DAT translates with: ``torch`` (the model in eager PyTorch,
:mod:`fadat.models.inference`) or ``onnxruntime`` (an export of ``fadat export --format onnx``
run by :class:`fadat.engine.runtime.OnnxDAT`). ``fadat translate --engine``, ``fadat serve
--engine`` and ``fadat.Translator.from_pretrained(..., engine=)`` all load through
:func:`load_translation_model`; the rest of the pipeline (:mod:`.pipeline`) sees one model
interface (:class:`OnnxRuntimeModel` gives the engine that interface).
"""

from __future__ import annotations

import atexit
import inspect
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from fadat.decoding.strategies import GRAPH, Strategy, StrategyError, offered
from fadat.engine import DEFAULT_ENGINE, ENGINES, resolve_engine
from fadat.engine.runtime import BEAM
from fadat.errors import InputError, NonFiniteOutputError
from fadat.models.architectures import Scored

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "OnnxRuntimeModel",
    "load_translation_model",
    "model_engine",
]


class OnnxRuntimeModel:
    """An :class:`fadat.engine.runtime.OnnxDAT` behind the part of the translation-model
    interface (:class:`fadat.models.architectures.TranslationModel`) that
    :func:`fadat.translation.pipeline.translate_lines` and the server use.

    Offers the strategies the export's graph feeds (greedy, lookahead without n-gram bans,
    Viterbi, joint-Viterbi; the beam search, with or without a language model, on an export of
    format version 2 with ``top_cand_n`` up to its ``top_k``), one hypothesis per sentence, no
    ``log P(y|x)`` (the graph does not give the full token head) and no scoring of given pairs.
    An export made with a vocabulary shortlist runs every strategy with it
    (:meth:`check_shortlist`).

    Attributes:
        engine: the runtime.
        config: ``model_type`` (``"dat"``), ``vocab_size``, ``max_source_positions``,
            ``max_target_positions`` and ``decoding_upsample_ratio`` of the export.
        directory: the export directory (named in error messages).
        device: always the CPU (the pipeline builds its batches there).
    """

    model_type: ClassVar[str] = "dat"
    autoregressive: ClassVar[bool] = False  # fadat evaluate runs it with --strategies
    decoder_kind: ClassVar[str] = GRAPH
    upsampled: ClassVar[bool] = True  # the export's graph size is λ·|x </s>|
    default_strategy: ClassVar[str] = "lookahead"
    has_graph: ClassVar[bool] = False  # the graph view needs the full token head
    reduced_head: ClassVar[bool] = False
    scores_pairs: ClassVar[bool] = False  # no score_batch: the server leaves log P(y|x) out
    # the DAT's (fadat.models.dat.DATModel.flag_aliases): the beam search's α is --length-penalty
    flag_aliases: ClassVar[dict[str, dict[str, str]]] = {BEAM: {"length_penalty": "alpha"}}

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        meta = engine.metadata
        self.config = SimpleNamespace(
            model_type=self.model_type,
            vocab_size=int(meta["vocab_size"]),
            max_source_positions=engine.max_source_positions,
            max_target_positions=engine.max_target_positions,
            decoding_upsample_ratio=engine.upsample_ratio,
        )
        self.directory = engine.directory
        self.device = torch.device("cpu")
        self.precisions = (engine.precision,)

    def offered_strategies(self) -> dict[str, Strategy]:
        """The registry's DAG strategies that the engine implements
        (:data:`fadat.engine.runtime.STRATEGIES`), name → record; the options a record allows
        beyond :meth:`strategies` (n-gram bans) are refused by :meth:`check_options`, and so is
        the beam search on an export that cannot run it."""
        from fadat.engine.runtime import STRATEGIES

        return {name: s for name, s in offered(GRAPH).items() if name in STRATEGIES}

    def strategies(self) -> dict[str, tuple[str, ...]]:
        """Strategy → its keyword options (:data:`fadat.engine.runtime.STRATEGIES`), for the
        strategies this export runs (:attr:`fadat.engine.runtime.OnnxDAT.strategies`: the beam
        search on format version 2 only)."""
        from fadat.engine.runtime import STRATEGIES

        return {
            name: tuple(
                p.name
                for p in inspect.signature(fn).parameters.values()
                if p.kind is p.KEYWORD_ONLY
            )
            for name, fn in STRATEGIES.items()
            if name in self.engine.strategies
        }

    def check_options(self, strategy: str, options: dict[str, Any], nbest: int = 1) -> None:
        """Validate options and ``nbest`` from the strategy's record
        (:meth:`fadat.decoding.strategies.Strategy.check_request`; no decode is tried), less
        what the engine does not implement (n-gram bans, several hypotheses) and, for the beam
        search, what the export cannot feed it (:meth:`fadat.engine.runtime.OnnxDAT.check_beam`).

        Raises:
            StrategyError: (a ``ValueError``) as ``check_request``; an option the record allows
                but this engine does not; ``nbest > 1``; ``beam`` on a format-version-1 export
                (export it again) or with ``top_cand_n`` above the export's ``top_k``.
        """
        record = self.offered_strategies().get(strategy)
        if record is None:
            raise StrategyError(
                f"strategy {strategy!r} is not available in the onnxruntime engine; "
                f"choose one of {', '.join(self.offered_strategies())}"
            )
        if strategy == BEAM:
            top_cand_n = options.get("top_cand_n", record.defaults["top_cand_n"])
            try:
                self.engine.check_beam(top_cand_n if isinstance(top_cand_n, int) else 1)
            except ValueError as err:
                raise StrategyError(str(err)) from None
        if nbest > 1:
            raise StrategyError(f"--nbest {nbest}: the onnxruntime engine gives one hypothesis")
        unsupported = sorted(set(options) - set(self.strategies().get(strategy, ())))
        if unsupported:
            raise StrategyError(
                f"strategy {strategy!r} on the onnxruntime engine does not take {unsupported}"
            )
        record.check_request(options, nbest)

    def check_shortlist(self, where: str | Path) -> None:
        """Check that the export runs with the shortlist at ``where`` (``fadat translate
        --engine onnxruntime --shortlist [FILE]``): an export's shortlist is part of its graph,
        chosen when exporting (``fadat export --format onnx --shortlist``), and every run uses
        it, so ``--shortlist`` names it rather than choosing one.

        Args:
            where: a shortlist file, or a directory holding ``shortlist.safetensors`` (for a
                bare ``--shortlist``: the export itself, which holds its copy, or the model
                directory exported for the run).

        Raises:
            InputError: an export without a shortlist; ``where`` missing, unreadable, for
                another vocabulary, or another table than the export's.
        """
        from fadat.models.shortlist import load_shortlist

        own = self.engine.shortlist
        if own is None:
            raise InputError(
                f"--shortlist: {self.directory} runs on the onnxruntime engine and was "
                "exported without a shortlist; an export's shortlist is chosen when exporting "
                "(fadat export --format onnx --shortlist), or run the model directory with "
                "--engine torch --shortlist"
            )
        given = load_shortlist(where, self.config.vocab_size)
        if not given.same_table(own):
            raise InputError(
                f"--shortlist {where}: not the shortlist of the ONNX export {self.directory} "
                "(an export's shortlist is chosen when exporting; --shortlist without FILE "
                "names the export's own)"
            )

    def batch_cost(self, source_length: int, upsample_ratio: float | None = None) -> int:
        """The graph size of a sentence of ``source_length`` tokens (with ``</s>``)."""
        return int(self.engine.graph_lengths(np.array([source_length]), upsample_ratio)[0])

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
        """One run of the exported graph and one numpy decode
        (:meth:`fadat.engine.runtime.OnnxDAT.run`, :func:`fadat.engine.decoding_np.decode`;
        for ``beam``: :meth:`~fadat.engine.runtime.OnnxDAT.run_top_k` and
        :func:`fadat.engine.beam_np.beam_search`).

        Args:
            source: ``(B, S)`` int64 ``x </s>`` right-padded.
            strategy, options, nbest: as :meth:`fadat.models.dat.DATModel.translate_batch`
                (``nbest`` must be 1).
            upsample_ratio: the decoding λ; ``None`` = the export's.
            with_log_prob: ignored: the hypotheses carry ``log_prob=None``.

        Raises:
            NonFiniteOutputError: NaN or +inf outputs of the graph.
        """
        from fadat.engine.decoding_np import decode
        from fadat.engine.runtime import NonFiniteGraphError

        run = self.engine.run_top_k if strategy == BEAM else self.engine.run
        try:
            outputs = run(source.cpu().numpy(), upsample_ratio)
        except NonFiniteGraphError as err:
            raise NonFiniteOutputError(err.what) from None
        if strategy == BEAM:
            hyps = self.engine.beam_search(*outputs, **options)
        else:
            hyps = decode(*outputs, strategy, **options)
        return [[Scored(h.tokens, h.score, None, len(h.tokens) + 2)] for h in hyps]

    def score_batch(self, *args: Any, **kwargs: Any):
        """Not offered: ``log P(y|x)`` needs the full token head (use ``--engine torch``).

        Raises:
            InputError: always.
        """
        raise InputError("scoring pairs needs the torch engine (the onnx graph gives top-1 only)")


def load_translation_model(
    directory: str | Path,
    engine: str = DEFAULT_ENGINE,
    device: str = "cpu",
    precision: str | None = None,
    intra_threads: int = 1,
    cli: bool = False,
    shortlist: bool | str | Path | None = None,
) -> tuple[Any, Any]:
    """Load a model for translation on ``engine``.

    Args:
        directory: ``torch``: a model directory. ``onnxruntime``: an export of ``fadat export
            --format onnx``, or a DAT model directory, which is then exported to a temporary
            directory first (about a minute; export once to skip it).
        engine: one of :data:`ENGINES`; ``auto`` (the default): ``onnxruntime`` for an
            export, ``torch`` for a model directory (:func:`fadat.engine.resolve_engine`).
        device: ``torch``: the device; ``onnxruntime``: must be ``cpu``.
        precision: ``torch``: fp32 (``None``), bf16 or int8 (:func:`.pipeline.apply_precision`);
            ``onnxruntime``: fp32 or int8, checked against an export's ``metadata.json``
            (``None``: the export's), used for the export of a model directory (``None``:
            fp32).
        intra_threads: ``onnxruntime``: threads of one graph run (0 = all cores); ``torch``
            uses ``torch.set_num_threads`` instead (``--threads``).
        cli: messages name ``--precision`` (the command line), else the keyword.
        shortlist: ``onnxruntime`` with a model directory: the vocabulary shortlist the
            directory is exported with (``True`` or ``"model"``: its
            ``shortlist.safetensors``; a file); an export runs its own shortlist, if it has
            one. Not read otherwise: :func:`.pipeline.apply_reduced_head` applies the torch
            engine's and checks an export's.

    Returns:
        ``(model, sentencepiece processor)``.

    Raises:
        InputError: unknown engine; a directory of the other engine; as
            :func:`fadat.models.directory.load_model`, :func:`.pipeline.apply_precision` and
            :func:`.onnx_export.export_onnx`; onnxruntime not installed; an export of another
            precision; a device other than the CPU for onnxruntime; an AT (or any model other
            than a DAT) for onnxruntime, before anything is exported; a ``shortlist`` to
            export with that is missing, unreadable or for another vocabulary.
    """
    from fadat.data.spm import load_sentencepiece
    from fadat.engine.runtime import EngineDirectoryError, OnnxDAT, is_engine_dir

    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    engine = resolve_engine(directory, engine)
    if engine == "torch":
        from fadat.models.directory import load_model
        from fadat.translation.pipeline import apply_precision

        if is_engine_dir(directory):
            raise InputError(
                f"{directory}: an ONNX export (fadat export --format onnx); run it with "
                "--engine onnxruntime"
            )
        model, sp = load_model(directory, device)
        return apply_precision(model, precision or "fp32", cli=cli), sp
    try:
        import onnxruntime  # noqa: F401
    except ImportError as err:
        raise InputError(
            "--engine onnxruntime needs onnxruntime: pip install 'fadat[onnx]'"
        ) from err
    if str(device) != "cpu":
        raise InputError(f"--engine onnxruntime runs on the CPU, not on {device}")
    directory = Path(directory)
    if not is_engine_dir(directory):
        from fadat.translation.onnx_export import export_onnx

        refuse_non_dat(directory, "--engine torch runs it")
        from fadat.translation.pipeline import shortlist_location

        where = shortlist_location(directory, shortlist)
        print(
            f"fadat: exporting {directory} to ONNX ({precision or 'fp32'}"
            f"{', shortlisted' if where is not None else ''}) for this run; "
            "`fadat export --format onnx` once saves this step",
            file=sys.stderr,
        )
        temporary = tempfile.mkdtemp(prefix="fadat-onnx-")
        atexit.register(shutil.rmtree, temporary, ignore_errors=True)
        target = Path(temporary) / "engine"
        directory = export_onnx(directory, target, precision=precision or "fp32", shortlist=where)
    try:
        runtime = OnnxDAT(directory, intra_threads=intra_threads)
    except EngineDirectoryError as err:
        raise InputError(str(err)) from None
    if precision is not None and runtime.precision != precision:
        raise InputError(
            f"{directory}: an export in {runtime.precision}, not {precision} (the precision of "
            "an ONNX export is chosen when exporting)"
        )
    sp = load_sentencepiece(directory / "spm.model")
    return OnnxRuntimeModel(runtime), sp


def refuse_non_dat(directory: str | Path, hint: str) -> None:
    """Refuse a model directory (not an export) for the onnxruntime engine unless it holds a
    DAT, before anything is exported; ``hint`` (the verb's) says what runs it instead.

    Raises:
        InputError: naming ``directory``, its model type and ``hint``; as
            :func:`fadat.models.directory.read_model_metadata`.
    """
    from fadat.models.directory import read_model_metadata

    kind = read_model_metadata(directory)["model_type"]
    if kind != "dat":
        raise InputError(
            f"{directory}: holds an {kind.upper()} model; the onnxruntime engine runs DAT models "
            f"only ({hint})"
        )


def model_engine(model: Any) -> tuple[str, str]:
    """The engine and the precision a loaded translation model runs with: ``("onnxruntime",
    the export's precision)`` for an :class:`OnnxRuntimeModel`, else ``("torch", its
    inference precision)`` (:func:`fadat.models.inference.precision_of`: ``fp32``, ``bf16`` or
    ``int8``)."""
    from fadat.models.inference import precision_of

    if isinstance(model, OnnxRuntimeModel):
        return "onnxruntime", model.engine.precision
    return "torch", precision_of(model)
