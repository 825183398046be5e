"""The translation core shared by ``fadat translate`` (:mod:`fadat.cli.translate`), ``score``,
``evaluate``, ``serve`` and the Python API (:class:`fadat.translation.translator.Translator`).

Data flow (one function, :func:`translate_lines`): raw text lines → sentencepiece ids ``x </s>``
(truncated to the model's ``max_source_positions`` with a warning) → token-budget batches of
sentences of similar length → the model (DAT: one decoder pass giving ``(token_logprobs, links)``
then a decoder of :mod:`fadat.decoding`; AT: :meth:`fadat.models.at.ATModel.greedy` or
``beam_search``) → ids → detokenised text, returned in input order. :func:`score_pairs` is the
same pipeline for ``log P(y|x)`` of given pairs (paper Eq. 3 for DAT, the chain rule for AT).

Input problems are :class:`~fadat.errors.InputError` (``fadat`` prints one line and exits 2):
invalid UTF-8 (the message names the file, line and byte offset), a missing or corrupt model
directory, a sentencepiece model that does not match the model's vocabulary, an option that the
chosen strategy does not take or an invalid option value, and a model whose outputs for a line
are NaN or infinite (:class:`~fadat.errors.NonFiniteOutputError`, naming the model directory and
the line: corrupt weights, finite but extreme ones included). An empty (or all-blank) input line
gives an empty output line without running the model.

Only CPU was run; the code is device-agnostic (``--device``) but CUDA was not run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fadat.data.contract import EOS_ID, pad_sequences
from fadat.errors import DecodingOptionError, InputError, shown
from fadat.models.architectures import naming_inputs
from fadat.models.directory import model_device
from fadat.options import DECODING_OPTIONS, OptionValueError

#: Default per-batch budget, in the models' ``batch_cost`` units
#: (:meth:`fadat.models.architectures.TranslationModel.batch_cost`); the verbs' ``--max-tokens``
#: default too.
DEFAULT_MAX_TOKENS = 4096

#: A callback that reports one problem of the input (a line skipped or cut) to the user.
Warn = Callable[[str], None]


@dataclass(frozen=True)
class Translation:
    """One hypothesis for one input sentence.

    Attributes:
        text: detokenised output (``""`` for an empty input line).
        tokens: output token ids (no ``<s>``/``</s>``/``<pad>``).
        score: the strategy's score in nats: DAT ``Hypothesis.score`` (``log P(a|x)`` plus the
            path tokens' log-probabilities, see :mod:`fadat.decoding`); AT the length-normalised
            beam score ``log P(y|x) / (|y|+1)^α``. NaN for an empty input line (not scored).
        log_prob: ``log P(y|x)`` of ``tokens`` in nats from the translating pass
            (:class:`fadat.models.architectures.Scored`) when asked for (``with_log_prob``); NaN for
            an empty input line; ``None`` when not asked or where the model cannot give it
            from that pass.
        covers: the number of tokens ``log_prob`` covers (as :attr:`PairScore.tokens`).
    """

    text: str
    tokens: list[int]
    score: float
    log_prob: float | None = math.nan
    covers: int = 1


@dataclass(frozen=True)
class PairScore:
    """Score of one (source, target) pair.

    Attributes:
        log_prob: ``log P(y|x)`` in nats. DAT: paper Eq. 3, the sum over every path of
            ``|<s> y </s>|`` vertices (−inf when the target has more tokens than the graph has
            vertices). AT: ``Σ_t log P(y_t | y_<t, x)`` over ``y </s>``. NaN when the AT model
            cannot score the target (longer than its ``max_target_positions``).
        tokens: the number of tokens ``log_prob`` covers: ``|<s> y </s>|`` for DAT (the DAG also
            emits ``<s>`` at vertex 0), ``|y </s>|`` for AT.
    """

    log_prob: float
    tokens: int

    @property
    def nll_per_token(self) -> float:
        """``−log_prob / tokens`` (docs/reference-behaviour.md, "DAG likelihood" normalises the DAG
        NLL by ``T`` likewise)."""
        return -self.log_prob / self.tokens


# ----------------------------------------------------------------------------------------------
# Strategies and their options


def strategy_options(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Strategy name → accepted keyword options, for this model (its ``strategies()``, from the
    records of :mod:`fadat.decoding.strategies`)."""
    return model.strategies()


#: The largest ``--nbest``: each candidate is one more decode of the graph, and a user who
#: asks for a million would wait for hours without a word.
MAX_NBEST = 1000


def check_strategy(
    model: nn.Module,
    strategy: str,
    options: dict[str, Any],
    nbest: int = 1,
    cli: bool = False,
) -> None:
    """Validate a strategy, its options and ``nbest`` before any input is read: the one check,
    from the strategy's record (:class:`fadat.decoding.strategies.Strategy`: the options it
    takes, their types and ranges, whether it gives n-best, whether it reads only each vertex's
    best token), through the model's
    :meth:`~fadat.models.architectures.TranslationModel.check_options`; no decode is tried.

    Args:
        cli: name options as command-line flags (``--beam-size``) rather than as the Python
            keyword arguments a library caller passed (``beam_size``).

    Raises:
        DecodingOptionError: (an InputError and a ValueError) a strategy this model does not
            offer, an option the strategy does not take, an invalid value, an ``nbest`` the
            strategy cannot give (or above :data:`MAX_NBEST`), or a shortlist or pruning with a
            strategy that reads more than each vertex's best token.
    """
    if not isinstance(strategy, str):
        raise DecodingOptionError(f"strategy must be a string, got {type(strategy).__name__}")
    offered = model.offered_strategies()
    record = offered.get(strategy)
    if record is None:
        raise DecodingOptionError(
            f"strategy {strategy!r} is not available for {model.model_type.upper()} models; "
            f"choose one of {', '.join(offered)}"
        )
    unknown = sorted(set(options) - set(record.option_names))
    if unknown:
        if cli:
            names = ", ".join("--" + name.replace("_", "-") for name in unknown)
        else:
            names = "the keyword argument " + ", ".join(unknown)
        raise DecodingOptionError(f"strategy {strategy!r} does not take {names}")
    try:
        check_option_values(options)
    except InputError as err:
        raise DecodingOptionError(str(err)) from None
    what = "--nbest" if cli else "nbest"
    if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
        raise DecodingOptionError(f"{what} must be an integer >= 1, got {nbest!r}")
    if nbest > MAX_NBEST:
        raise DecodingOptionError(f"{what} must be at most {MAX_NBEST}, got {nbest}")
    try:
        model.check_options(strategy, options, nbest)  # the record's check_request
    except ValueError as err:
        message = str(err) if cli else str(err).replace("--nbest", "nbest")
        if nbest > 1 and not record.nbest:
            many = [name for name, s in offered.items() if s.nbest]
            message += (
                f"; n-best lists come from {', '.join(repr(n) for n in many)}"
                if many
                else f"; no {model.model_type.upper()} strategy gives several"
            )
        raise DecodingOptionError(f"strategy {strategy!r}: {message}") from None
    reduced = getattr(model, "inference_shortlist", None) is not None or (
        getattr(model, "inference_prune_threshold", None) is not None
    )
    if reduced and not record.reads_top1_only(options):
        top1 = [name for name, s in offered.items() if s.top1]
        raise DecodingOptionError(
            f"strategy {strategy!r}: --shortlist and --prune-threshold apply to "
            f"{', '.join(top1)} (the decoders that read each vertex's best token only; "
            "lookahead without n-gram bans)"
        )


def check_option_values(options: dict[str, Any]) -> None:
    """Check the type and range of each known decoding option (as the CLI flags' types do, so a
    Python caller gets the same answer as a command-line user; ``None`` = the default).

    Raises:
        InputError: a value that is not a number, NaN or infinite, not an integer where one is
            needed, or below the option's minimum.
    """
    for name, value in options.items():
        option = DECODING_OPTIONS.get(name)
        if option is None or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"option {name}: expected a number, got {type(value).__name__}")
        try:
            option.parse(str(value))
        except OptionValueError as err:
            raise InputError(f"option {name}: {err}") from None


def _finite(value: int | float) -> bool:
    """Whether a number is finite as a float (an int beyond 1.8e308, e.g. ``10**400``, is not:
    ``math.isfinite`` raises OverflowError for it)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_upsample_ratio(upsample_ratio: Any, model: nn.Module | None = None) -> None:
    """Check a decoding λ given by a caller (``None`` = the model's own).

    Args:
        upsample_ratio: the λ, or ``None``.
        model: the model it is for; ``None`` checks the value only.

    Raises:
        InputError: not ``None`` nor a finite number > 0.
        DecodingOptionError: (an InputError and a ValueError) a λ for a model whose decoder
            length does not depend on it (``model.upsampled`` false: the AT, the NAT), which
            would ignore it.
    """
    if upsample_ratio is not None and (
        isinstance(upsample_ratio, bool)
        or not isinstance(upsample_ratio, int | float)
        or not _finite(upsample_ratio)
        or upsample_ratio <= 0
    ):
        raise InputError(
            f"upsample_ratio must be None or a finite number > 0, got {shown(upsample_ratio)}"
        )
    if upsample_ratio is not None and model is not None and not model.upsampled:
        raise DecodingOptionError(
            f"upsample_ratio (--upsample-ratio) sizes the decoder of DAT and CTC models "
            f"(L = λ·|x|); this {model.model_type.upper()} model does not use one"
        )


# ----------------------------------------------------------------------------------------------
# Encoding, batching


def encode_sources(
    sp: Any,
    lines: Sequence[str],
    max_positions: int,
    warn: Warn,
    keep_empty: bool = False,
    first: int = 0,
) -> list[list[int] | None]:
    """Sentencepiece ids ``x </s>`` of each line; ``None`` for an empty or all-blank line unless
    ``keep_empty`` (then it is just ``[</s>]``).

    A line longer than ``max_positions`` ids (including ``</s>``) is truncated to its first
    ``max_positions − 1`` pieces plus ``</s>``, and ``warn`` is called with a message naming the
    line (1-based, counted from ``first + 1``: the position of ``lines[0]`` in its input).
    """
    from fadat.data.spm import encode_source

    out: list[list[int] | None] = []
    for number, line in enumerate(lines, start=first + 1):
        if not keep_empty and not line.strip():
            out.append(None)
            continue
        ids = list(encode_source(sp, line))
        if len(ids) > max_positions:
            warn(
                f"line {number}: {len(ids)} source tokens exceed the model's maximum of "
                f"{max_positions}; truncated"
            )
            ids = ids[: max_positions - 1] + [EOS_ID]
        out.append(ids)
    return out


def make_batches(
    costs: Sequence[int], max_tokens: int | None, max_sentences: int | None = None
) -> list[list[int]]:
    """Group sentence indices into batches of similar cost, longest first.

    A batch's padded cost ``len(batch) · max(cost)`` stays ≤ ``max_tokens`` (a single sentence
    over the budget forms its own batch) and its size ≤ ``max_sentences``. Indices are sorted by
    decreasing cost (stable, so equal costs keep input order); callers put results back by index.

    Args:
        costs: per-sentence cost (e.g. the model's ``batch_cost``,
            :meth:`fadat.models.architectures.TranslationModel.batch_cost`).
        max_tokens: budget; ``None`` or 0 = unlimited.
        max_sentences: sentences per batch; ``None`` or 0 = unlimited.

    Returns:
        A partition of ``range(len(costs))`` into lists.
    """
    order = sorted(range(len(costs)), key=lambda i: -costs[i])
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        new_width = max(width, costs[i])
        too_many = bool(max_sentences) and len(current) >= max_sentences
        too_big = bool(max_tokens) and new_width * (len(current) + 1) > max_tokens
        if current and (too_many or too_big):
            batches.append(current)
            current, new_width = [], costs[i]
        current.append(i)
        width = new_width
    if current:
        batches.append(current)
    return batches


# ----------------------------------------------------------------------------------------------
# The translation core


def translate_lines(
    model: nn.Module,
    sp: Any,
    lines: Sequence[str],
    *,
    strategy: str | None = None,
    options: dict[str, Any] | None = None,
    nbest: int = 1,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    max_sentences: int | None = None,
    warn: Warn | None = None,
    check: bool = True,
    upsample_ratio: float | None = None,
    with_log_prob: bool = False,
) -> list[list[Translation]]:
    """Translate raw text lines: encode → batch → model → decode → detokenise, in input order.

    The one translation pipeline of fadat (``fadat translate``, ``fadat evaluate`` and
    :class:`~fadat.translation.translator.Translator` all call it, through
    :func:`iter_translations`). Sentences are sorted by length into batches under a budget
    (:func:`make_batches`, cost ``model.batch_cost``) and the results are put back in input order.
    The model runs under ``torch.inference_mode`` on the device of its parameters.

    Args:
        model: a DAT or AT model (eval mode).
        sp: its sentencepiece processor.
        lines: raw text, one sentence each.
        strategy: a name from :func:`strategy_options`; ``None`` = the model's
            ``default_strategy``.
        options: the strategy's keyword options (e.g. ``{"beta": 1.0}``).
        nbest: hypotheses per sentence (``> 1`` only for DAT ``sample``: repeated draws with
            seeds ``seed, seed+1, …``; duplicate outputs are merged, so fewer may come back).
        max_tokens: per-batch budget of padded positions (graph vertices for DAT, source tokens
            for AT); ``None``/0 = unlimited.
        max_sentences: sentences per batch; ``None``/0 = unlimited (``1`` = batch size 1).
        warn: receives warnings (over-long lines); default :func:`warnings.warn`.
        check: validate strategy and options first (:func:`check_strategy`); callers that
            already did may skip it.
        upsample_ratio: the decoding λ (``--upsample-ratio``: graph size ``λ·|x </s>|`` of a
            DAT, decoder length of a CTC); ``None`` = the model's. The model is not changed.
        with_log_prob: fill each :attr:`Translation.log_prob` from the translating pass
            (:meth:`~fadat.models.architectures.TranslationModel.translate_batch`; it can cost more
            than the translation, so it is off unless asked for).

    Returns:
        For each line, a list of :class:`Translation` (best first; exactly one when
        ``nbest == 1``; one empty translation with NaN score for an empty line).

    Raises:
        InputError: as :func:`check_strategy` and :func:`check_upsample_ratio`.
        NonFiniteOutputError: the model's outputs for a line are NaN or infinite (an
            InputError naming the model directory and the line).
    """
    return [
        hyps
        for _, hyps in iter_translations(
            model,
            sp,
            lines,
            strategy=strategy,
            options=options,
            nbest=nbest,
            max_tokens=max_tokens,
            max_sentences=max_sentences,
            warn=warn,
            check=check,
            upsample_ratio=upsample_ratio,
            with_log_prob=with_log_prob,
        )
    ]


def iter_translations(
    model: nn.Module,
    sp: Any,
    lines: Sequence[str],
    *,
    strategy: str | None = None,
    options: dict[str, Any] | None = None,
    nbest: int = 1,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    max_sentences: int | None = None,
    chunk_lines: int | None = None,
    warn: Warn | None = None,
    check: bool = True,
    progress: Callable[[int], None] | None = None,
    upsample_ratio: float | None = None,
    with_log_prob: bool = False,
) -> Iterator[tuple[int, list[Translation]]]:
    """:func:`translate_lines` as a stream: ``(line index, hypotheses)`` in input order, one
    chunk at a time, as soon as the chunk is done.

    The input is cut into consecutive chunks of ``chunk_lines`` lines (``None``/0: one chunk,
    the whole input); each chunk is sorted by length into batches (:func:`make_batches`),
    translated, and yielded in input order. Smaller chunks show results sooner; larger ones
    batch sentences of similar length better.

    Args:
        model, sp, lines, strategy, options, nbest, max_tokens, max_sentences, warn, check,
        upsample_ratio, with_log_prob: as :func:`translate_lines`.
        chunk_lines: lines per chunk (``None`` or 0: all).
        progress: called with the number of lines each finished batch (or empty line) covers.

    Yields:
        ``(index, hypotheses)`` for every line, ``index`` = 0, 1, 2, ….

    Raises:
        InputError: as :func:`check_strategy` and :func:`check_upsample_ratio`, or
            ``chunk_lines < 0``.
    """
    from fadat.data.spm import decode as detokenize

    strategy = strategy or model.default_strategy
    options = dict(options or {})
    if check:
        check_strategy(model, strategy, options, nbest)
        check_upsample_ratio(upsample_ratio, model)
    if chunk_lines is not None and chunk_lines < 0:
        raise InputError(f"chunk_lines must be >= 0, got {chunk_lines}")
    warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
    device = model_device(model)
    step = chunk_lines or max(len(lines), 1)
    for start in range(0, len(lines), step):
        chunk = lines[start : start + step]
        encoded = encode_sources(sp, chunk, model.config.max_source_positions, warn, first=start)
        results = [[Translation("", [], math.nan)] for _ in range(len(chunk))]
        todo = [i for i, ids in enumerate(encoded) if ids is not None]
        if progress is not None and len(chunk) > len(todo):
            progress(len(chunk) - len(todo))  # empty lines: nothing to translate
        costs = [model.batch_cost(len(encoded[i]), upsample_ratio) for i in todo]
        with torch.inference_mode():
            for batch in make_batches(costs, max_tokens, max_sentences):
                rows = [todo[k] for k in batch]
                source = pad_sequences([encoded[i] for i in rows]).to(device)  # (B, S)
                with naming_inputs(model, [start + i + 1 for i in rows]):
                    hyps = model.translate_batch(
                        source,
                        strategy,
                        options,
                        nbest,
                        upsample_ratio=upsample_ratio,
                        with_log_prob=with_log_prob,
                    )
                for i, sentence_hyps in zip(rows, hyps, strict=True):
                    results[i] = [
                        Translation(
                            detokenize(sp, h.tokens), h.tokens, h.score, h.log_prob, h.covers
                        )
                        for h in sentence_hyps
                    ]
                if progress is not None:
                    progress(len(rows))
        yield from enumerate(results, start=start)


def score_pairs(
    model: nn.Module,
    sp: Any,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    warn: Warn | None = None,
    upsample_ratio: float | None = None,
) -> list[PairScore]:
    """``log P(y|x)`` of (source, target) pairs, in input order.

    DAT: paper Eq. 3 via :func:`fadat.dag.dag_log_likelihood` on the graph translation uses
    (``graph_lengths(…, decoding=True)``), target ``<s> y </s>``. AT: teacher-forced
    ``Σ_t log P(y_t | y_<t, x)`` over ``y </s>``. Sources are encoded and truncated exactly as in
    :func:`translate_lines`; an empty line is scored like any other (``y`` = nothing).

    Args:
        model, sp: as :func:`translate_lines`.
        sources, targets: raw text, equally many.
        max_tokens: per-batch budget (the model's ``batch_cost`` of the source).
        warn: receives warnings (truncated sources, targets the model cannot score).
        upsample_ratio: the decoding λ (as :func:`translate_lines`); ``None`` = the model's.

    Returns:
        One :class:`PairScore` per pair.

    Raises:
        InputError: different numbers of sources and targets; as :func:`check_upsample_ratio`.
        NonFiniteOutputError: as :func:`translate_lines`.
    """
    from fadat.data.spm import encode_target

    if len(sources) != len(targets):
        raise InputError(f"{len(sources)} source lines but {len(targets)} target lines")
    check_upsample_ratio(upsample_ratio, model)
    warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
    src_ids = encode_sources(sp, sources, model.config.max_source_positions, warn, keep_empty=True)
    tgt_ids = [list(encode_target(sp, line)) for line in targets]  # <s> y </s>
    results: list[PairScore] = [PairScore(math.nan, 1)] * len(sources)
    costs = [model.batch_cost(len(ids), upsample_ratio) for ids in src_ids]
    device = model_device(model)
    with torch.inference_mode():
        for batch in make_batches(costs, max_tokens):
            source = pad_sequences([src_ids[i] for i in batch]).to(device)  # (B, S)
            target = pad_sequences([tgt_ids[i] for i in batch]).to(device)  # (B, T)
            target_lengths = torch.tensor([len(tgt_ids[i]) for i in batch], device=device)
            with naming_inputs(model, [i + 1 for i in batch]):
                scores = model.score_batch(
                    source, target, target_lengths, upsample_ratio=upsample_ratio
                )
            for k, i in enumerate(batch):
                if scores.problems[k] is not None:
                    warn(f"line {i + 1}: {scores.problems[k]}")
                results[i] = PairScore(scores.log_probs[k], scores.tokens[k])
    return results


# ----------------------------------------------------------------------------------------------
# Precision and a reduced token head (of a loaded model)


def apply_precision(model: nn.Module, precision: str, cli: bool = False) -> nn.Module:
    """``model`` converted for inference in ``precision`` (fadat.models.inference; the precisions of
    the model's ``precisions``, on the CPU). Messages name ``--precision`` with ``cli``, else
    the keyword ``precision``.

    Raises:
        InputError: unknown precision, or other than fp32 for a model without it in its
            ``precisions`` (AT, NAT, CTC) or off the CPU.
    """
    from fadat.models.inference import PRECISIONS, with_precision

    name = "--precision" if cli else "precision"
    if precision not in PRECISIONS:
        raise InputError(f"{name} must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return model
    if precision not in model.precisions or model_device(model).type != "cpu":
        shown = f"--precision {precision}" if cli else f"precision={precision!r}"
        raise InputError(f"{shown} is for DAT models on the CPU")
    return with_precision(model, precision)


def shortlist_location(
    directory: str | Path, shortlist: bool | str | Path | None
) -> str | Path | None:
    """Where a ``shortlist`` argument points: ``None`` for ``None``/``False`` (off),
    ``directory`` (its ``shortlist.safetensors``) for ``True`` or ``"model"``, else the path
    given.

    Raises:
        InputError: anything else than those.
    """
    if shortlist is None or shortlist is False:
        return None
    where = directory if shortlist is True or shortlist == "model" else shortlist
    if not isinstance(where, str | Path):
        raise InputError(f"shortlist must be True, 'model' or a path, got {shortlist!r}")
    return where


def apply_reduced_head(
    model: nn.Module,
    directory: str | Path,
    shortlist: bool | str | Path | None = None,
    prune_threshold: float | None = None,
    cli: bool = False,
) -> nn.Module:
    """``model`` tagged to run with a shortlist and/or pruning (fadat.models.inference
    :func:`~fadat.models.inference.with_reduced_head`). Messages name the flags with ``cli``,
    else the keywords.

    The onnxruntime engine's model (:class:`fadat.translation.engines.OnnxRuntimeModel`) runs
    the shortlist its export was made with, if any (``fadat export --format onnx
    --shortlist``): there ``shortlist`` only checks that the export has that shortlist
    (``True``: any, its own copy), and pruning is refused.

    Args:
        model: the model loaded from ``directory``.
        directory: its model directory (where ``shortlist=True``/``"model"`` looks), or the
            export it was loaded from.
        shortlist: ``None``/``False`` off; ``True`` or ``"model"`` the directory's
            ``shortlist.safetensors``; else a shortlist file.
        prune_threshold: τ in ``[0, 1]`` or ``None`` (off).

    Raises:
        InputError: either set for a model without ``reduced_head`` (AT, NAT, CTC), pruning on
            the onnxruntime engine; a missing or unreadable shortlist, or one for another
            vocabulary; on the onnxruntime engine an export without a shortlist or with
            another one (:meth:`~fadat.translation.engines.OnnxRuntimeModel.check_shortlist`);
            τ outside ``[0, 1]``.
    """
    from fadat.models.inference import with_reduced_head
    from fadat.models.shortlist import load_shortlist

    where = shortlist_location(directory, shortlist)
    if where is None and prune_threshold is None:
        return model
    if not model.reduced_head:
        check = getattr(model, "check_shortlist", None)  # the onnxruntime engine's
        if check is None:
            names = "--shortlist and --prune-threshold" if cli else "shortlist and prune_threshold"
            raise InputError(f"{names} are for DAT models on the torch engine")
        if prune_threshold is not None:
            name = "--prune-threshold" if cli else "prune_threshold"
            raise InputError(
                f"{name} is for DAT models on the torch engine (the onnxruntime engine's graph "
                "computes the token head on every vertex)"
            )
        check(where)
        return model
    loaded = None if where is None else load_shortlist(where, model.config.vocab_size)
    try:
        return with_reduced_head(model, loaded, prune_threshold)
    except ValueError as err:
        raise InputError(str(err)) from err
