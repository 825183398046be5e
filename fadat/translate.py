"""``fadat translate`` and the translation core shared by ``translate``, ``score``, ``evaluate``
and :class:`Translator`.

Data flow (one function, :func:`translate_lines`): raw text lines → sentencepiece ids ``x </s>``
(truncated to the model's ``max_source_positions`` with a warning) → token-budget batches of
sentences of similar length → the model (DAT: one decoder pass giving ``(token_logprobs, links)``
then a decoder of :mod:`fadat.decoding`; AT: :meth:`fadat.baseline.ATModel.greedy` or
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

import argparse
import math
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fadat.architectures import naming_inputs
from fadat.data.contract import EOS_ID, pad_sequences
from fadat.data.text import read_lines
from fadat.errors import InputError
from fadat.model_dir import check_vocabulary, load_model, model_device
from fadat.options import DECODING_OPTIONS, nonnegative_int, positive_int
from fadat.verbs import (
    DEFAULT_MAX_TOKENS,
    Warn,
    add_common_arguments,
    add_decoding_arguments,
    add_head_arguments,
    apply_threads,
    check_output,
    decoding_options,
    open_output,
    stderr_warner,
)

#: ``fadat translate``: lines translated (and written) at a time (see :func:`iter_translations`).
DEFAULT_CHUNK_LINES = 128


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
            (:class:`fadat.architectures.Scored`) when asked for (``with_log_prob``); NaN for
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
    """Strategy name → accepted keyword options, for this model (its ``strategies()``)."""
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
    """Validate a strategy, its options and ``nbest`` before any input is read.

    The model checks the values (:meth:`~fadat.architectures.TranslationModel.check_options`;
    a DAT tries them once on a small synthetic graph, so ``top_p = 2`` fails here with the
    decoder's own message).

    Args:
        cli: name options as command-line flags (``--beam-size``) rather than as the Python
            keyword arguments a library caller passed (``beam_size``).

    Raises:
        InputError: unknown strategy for this model, an option the strategy does not take,
            an invalid value, or an ``nbest`` the strategy cannot give (or above
            :data:`MAX_NBEST`).
    """
    if not isinstance(strategy, str):
        raise InputError(f"strategy must be a string, got {type(strategy).__name__}")
    known = model.strategies()
    if strategy not in known:
        raise InputError(
            f"strategy {strategy!r} is not available for {model.model_type.upper()} models; "
            f"choose one of {', '.join(known)}"
        )
    unknown = sorted(set(options) - set(known[strategy]))
    if unknown:
        if cli:
            names = ", ".join("--" + name.replace("_", "-") for name in unknown)
        else:
            names = "the keyword argument " + ", ".join(unknown)
        raise InputError(f"strategy {strategy!r} does not take {names}")
    check_option_values(options)
    what = "--nbest" if cli else "nbest"
    if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
        raise InputError(f"{what} must be an integer >= 1, got {nbest!r}")
    if nbest > MAX_NBEST:
        raise InputError(f"{what} must be at most {MAX_NBEST}, got {nbest}")
    try:
        model.check_options(strategy, options, nbest)
    except ValueError as err:
        message = str(err) if cli else str(err).replace("--nbest", "nbest")
        raise InputError(f"strategy {strategy!r}: {message}") from err


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
        except argparse.ArgumentTypeError as err:
            raise InputError(f"option {name}: {err}") from None


def check_upsample_ratio(upsample_ratio: Any) -> None:
    """Check a decoding λ given by a caller (``None`` = the model's own).

    Raises:
        InputError: not ``None`` nor a finite number > 0.
    """
    if upsample_ratio is not None and (
        isinstance(upsample_ratio, bool)
        or not isinstance(upsample_ratio, int | float)
        or not math.isfinite(upsample_ratio)
        or upsample_ratio <= 0
    ):
        raise InputError(
            f"upsample_ratio must be None or a finite number > 0, got {upsample_ratio!r}"
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
            :meth:`fadat.architectures.TranslationModel.batch_cost`).
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
    :class:`Translator` all call it, through :func:`iter_translations`). Sentences are sorted by
    length into batches under a budget (:func:`make_batches`, cost ``model.batch_cost``) and the
    results are put back in input order. The model runs under ``torch.inference_mode`` on the
    device of its parameters.

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
            (:meth:`~fadat.architectures.TranslationModel.translate_batch`; it can cost more
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
        check_upsample_ratio(upsample_ratio)
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
    check_upsample_ratio(upsample_ratio)
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
# Python API


class Translator:
    """Translate and score with a model directory from Python.

    Example::

        translator = fadat.Translator.from_pretrained("runs/fa-dat/model")
        translator.translate(["Hola mundo."], strategy="lookahead")

    Attributes:
        model: the loaded DAT or AT model (eval mode).
        sp: its sentencepiece processor.
        upsample_ratio: the decoding λ every call decodes and scores with (``None`` = the
            model's); passed as an argument, the model's config is not changed.

    Raises:
        InputError: as :func:`check_vocabulary` and :func:`check_upsample_ratio`.
    """

    def __init__(self, model: nn.Module, sp: Any, upsample_ratio: float | None = None) -> None:
        check_vocabulary(sp, model)
        check_upsample_ratio(upsample_ratio)
        self.model = model
        self.sp = sp
        self.upsample_ratio = upsample_ratio

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        device: str = "cpu",
        upsample_ratio: float | None = None,
        precision: str = "fp32",
        shortlist: bool | str | Path | None = None,
        prune_threshold: float | None = None,
    ) -> Translator:
        """Load a model directory (DAT or AT) onto ``device``; ``upsample_ratio`` is the
        decoding λ the translator passes to the model (:attr:`upsample_ratio`); a DAT can run in
        ``precision`` ``fp32``, ``bf16`` or ``int8`` weights on the CPU
        (:func:`fadat.inference.with_precision`), with a vocabulary ``shortlist`` (``True``:
        the directory's ``shortlist.safetensors``, or a path) and with the token head pruned
        to vertices of passing probability ≥ ``prune_threshold`` (:func:`apply_reduced_head`).

        Raises:
            InputError: as :func:`load_model`, :func:`apply_precision`,
                :func:`apply_reduced_head` and :func:`check_upsample_ratio`.
        """
        if not isinstance(directory, str | Path):
            raise InputError(
                f"directory must be a path (str or pathlib.Path), got {type(directory).__name__}"
            )
        for name, value in (("device", device), ("precision", precision)):
            if not isinstance(value, str | torch.device) or (
                name == "precision" and not isinstance(value, str)
            ):
                raise InputError(f"{name} must be a string, got {type(value).__name__}")
        check_upsample_ratio(upsample_ratio)
        model, sp = load_model(directory, device)
        model = apply_precision(model, precision)
        model = apply_reduced_head(model, directory, shortlist, prune_threshold)
        return cls(model, sp, upsample_ratio)

    @property
    def model_type(self) -> str:
        """``"dat"`` or ``"at"``."""
        return self.model.model_type

    def translate(
        self,
        sentences: str | Sequence[str],
        strategy: str | None = None,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        **options: Any,
    ) -> str | list[str]:
        """Translate raw sentences; one detokenised string per sentence, in order.

        Args:
            sentences: one sentence (a ``str``: its translation is returned as a ``str``) or a
                sequence of sentences (a list of translations is returned).
            strategy: see :func:`strategy_options`; default lookahead (DAT) or beam (AT).
            max_tokens: per-batch budget (see :func:`translate_lines`).
            **options: the strategy's options, e.g. ``beta=1.0``, ``length_penalty=1.1``.

        Raises:
            InputError: ``sentences`` is neither a string nor a sequence of strings; unknown
                strategy or option, invalid value.
            NonFiniteOutputError: (an InputError) the model's outputs for a sentence are NaN
                or infinite: its weights are corrupt (finite but extreme ones included).
        """
        lines, single = _sentences(sentences, "sentences")
        results = translate_lines(
            self.model,
            self.sp,
            lines,
            strategy=strategy,
            options=options,
            max_tokens=_max_tokens(max_tokens),
            upsample_ratio=self.upsample_ratio,
        )
        texts = [hyps[0].text for hyps in results]
        return texts[0] if single else texts

    def translate_nbest(
        self,
        sentences: str | Sequence[str],
        nbest: int,
        strategy: str | None = None,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        **options: Any,
    ) -> list[Translation] | list[list[Translation]]:
        """Up to ``nbest`` :class:`Translation` per sentence (DAT ``sample`` for ``nbest > 1``);
        for one sentence given as a ``str``, its list alone.

        Raises:
            InputError: as :meth:`translate`, or ``nbest`` is not an integer >= 1.
        """
        lines, single = _sentences(sentences, "sentences")
        results = translate_lines(
            self.model,
            self.sp,
            lines,
            strategy=strategy,
            options=options,
            nbest=nbest,
            max_tokens=_max_tokens(max_tokens),
            upsample_ratio=self.upsample_ratio,
        )
        return results[0] if single else results

    def score(
        self,
        sources: str | Sequence[str],
        targets: str | Sequence[str],
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
    ) -> PairScore | list[PairScore]:
        """``log P(y|x)`` of each pair (see :func:`score_pairs`); one :class:`PairScore` for a
        source and a target given as strings.

        Raises:
            InputError: a source or target that is not a string, one string against a
                sequence, or different numbers of sources and targets.
            NonFiniteOutputError: as :meth:`translate`.
        """
        src, single_src = _sentences(sources, "sources")
        tgt, single_tgt = _sentences(targets, "targets")
        if single_src != single_tgt:
            raise InputError("give sources and targets both as strings or both as sequences")
        scores = score_pairs(
            self.model,
            self.sp,
            src,
            tgt,
            max_tokens=_max_tokens(max_tokens),
            upsample_ratio=self.upsample_ratio,
        )
        return scores[0] if single_src else scores


def _sentences(value: Any, name: str) -> tuple[list[str], bool]:
    """``(lines, was_one_string)`` from a string or a sequence of strings.

    Raises:
        InputError: anything else (bytes, None, a number, a sequence holding a non-string).
    """
    if isinstance(value, str):
        return [value], True
    if isinstance(value, Mapping | Set):  # its keys, in no meaningful order: not sentences
        raise InputError(
            f"{name} must be a string or a sequence of strings, got {type(value).__name__}"
        )
    if isinstance(value, bytes | bytearray) or not isinstance(value, Iterable):
        raise InputError(
            f"{name} must be a string or a sequence of strings, got {type(value).__name__}"
        )
    lines = list(value)
    for i, item in enumerate(lines):
        if not isinstance(item, str):
            raise InputError(f"{name}[{i}] is a {type(item).__name__}, expected a string")
    return lines, False


def _max_tokens(value: Any) -> int | None:
    """``max_tokens`` of the Python API: ``None`` or an integer >= 0 (0 = unlimited).

    Raises:
        InputError: another type or a negative value.
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InputError(f"max_tokens must be None or an integer >= 0, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat translate``."""
    parser.description = (
        "Translate raw text (one sentence per line) with a DAT or AT model directory. "
        "Output: one detokenised line per input line (with --nbest N > 1: up to N lines per "
        "input line, 'LINE<TAB>[SCORE<TAB>]TEXT' with the 1-based input line number)."
    )
    parser.add_argument("--model", required=True, help="model directory (save_pretrained)")
    parser.add_argument("--input", default=None, help="input file (default: stdin)")
    parser.add_argument("--output", default=None, help="output file (default: stdout)")
    parser.add_argument(
        "--strategy",
        default=None,
        help="DAT: greedy, lookahead (default), viterbi, joint-viterbi, sample, beam; "
        "AT: greedy, beam (default)",
    )
    parser.add_argument(
        "--nbest",
        type=positive_int,
        default=1,
        help="hypotheses per line (> 1: DAT sample only)",
    )
    parser.add_argument(
        "--chunk-lines",
        type=nonnegative_int,
        default=DEFAULT_CHUNK_LINES,
        help="translate and write the input this many lines at a time, each chunk sorted by "
        f"length into batches (0 = all at once; default {DEFAULT_CHUNK_LINES})",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    parser.add_argument(
        "--print-scores",
        action="store_true",
        help="prefix each output with its score (nats) and a tab",
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "bf16", "int8"),
        help="DAT on CPU: weights in fp32 (default), bf16 or int8 (fadat.inference; test BLEU "
        "of each in RESULTS.md)",
    )
    add_head_arguments(parser)
    add_common_arguments(parser)
    add_decoding_arguments(parser)


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """``model`` converted for inference in ``precision`` (fadat.inference; the precisions of
    the model's ``precisions``, on the CPU).

    Raises:
        InputError: unknown precision, or other than fp32 for a model without it in its
            ``precisions`` (AT, NAT, CTC) or off the CPU.
    """
    from fadat.inference import PRECISIONS, with_precision

    if precision not in PRECISIONS:
        raise InputError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return model
    if precision not in model.precisions or model_device(model).type != "cpu":
        raise InputError(f"--precision {precision} is for DAT models on the CPU")
    return with_precision(model, precision)


def apply_reduced_head(
    model: nn.Module,
    directory: str | Path,
    shortlist: bool | str | Path | None = None,
    prune_threshold: float | None = None,
) -> nn.Module:
    """``model`` tagged to run with a shortlist and/or pruning (fadat.inference
    :func:`~fadat.inference.with_reduced_head`).

    Args:
        model: the model loaded from ``directory``.
        directory: its model directory (where ``shortlist=True``/``"model"`` looks).
        shortlist: ``None``/``False`` off; ``True`` or ``"model"`` the directory's
            ``shortlist.safetensors``; else a shortlist file.
        prune_threshold: τ in ``[0, 1]`` or ``None`` (off).

    Raises:
        InputError: either set for a model without ``reduced_head`` (AT, NAT, CTC); a missing
            or unreadable shortlist, or one for another vocabulary; τ outside ``[0, 1]``.
    """
    from fadat.inference import with_reduced_head
    from fadat.shortlist import load_shortlist

    if shortlist is False:
        shortlist = None
    if shortlist is None and prune_threshold is None:
        return model
    if not model.reduced_head:
        raise InputError("--shortlist and --prune-threshold are for DAT models")
    loaded = None
    if shortlist is not None:
        where = directory if shortlist is True or shortlist == "model" else shortlist
        if not isinstance(where, str | Path):
            raise InputError(f"shortlist must be True, 'model' or a path, got {shortlist!r}")
        loaded = load_shortlist(where, model.config.vocab_size)
    try:
        return with_reduced_head(model, loaded, prune_threshold)
    except ValueError as err:
        raise InputError(str(err)) from err


def format_translations(
    hyps: list[Translation], number: int, nbest: int, scores: bool
) -> list[str]:
    """Output lines of one input line (see :func:`add_arguments` for the format)."""
    lines = []
    for h in hyps:
        text = h.text.replace("\n", " ")
        fields = [f"{h.score:.4f}"] if scores else []
        if nbest > 1:
            fields.insert(0, str(number))
        lines.append("\t".join([*fields, text]))
    return lines


def run(args: argparse.Namespace) -> int:
    """``fadat translate``: read, translate, write; returns the exit code.

    Output goes out one chunk (``--chunk-lines``) at a time: to stdout as soon as the chunk is
    done (Ctrl-C keeps the finished chunks there), to an ``--output`` file all-or-nothing.
    """
    apply_threads(args.threads)
    check_output(args.output, [("--input", args.input), ("--model", args.model)])
    model, sp = load_model(args.model, args.device)
    model = apply_precision(model, args.precision)
    model = apply_reduced_head(model, args.model, args.shortlist, args.prune_threshold)
    strategy = args.strategy or model.default_strategy
    options = decoding_options(args, model, strategy)
    check_strategy(model, strategy, options, args.nbest, cli=True)
    lines = read_lines(args.input, stdin=True)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    from tqdm import tqdm

    bar = tqdm(total=len(lines), unit="line", desc="translate", disable=not show, file=sys.stderr)
    stream = iter_translations(
        model,
        sp,
        lines,
        strategy=strategy,
        options=options,
        nbest=args.nbest,
        max_tokens=args.max_tokens,
        chunk_lines=args.chunk_lines,
        warn=stderr_warner(args.input or "<stdin>"),
        check=False,
        progress=bar.update,
        upsample_ratio=args.upsample_ratio,
    )
    try:
        with open_output(args.output) as out:
            for index, hyps in stream:
                for line in format_translations(hyps, index + 1, args.nbest, args.print_scores):
                    out.write(line + "\n")
                if out is sys.stdout:
                    out.flush()  # a finished line is the user's, whatever happens next
    finally:
        bar.close()
    return 0
