"""The decoding strategies, one record each (:class:`Strategy`), in one registry
(:data:`REGISTRY`): what a strategy is called, what runs it, the options it takes (type, default,
range), whether it reads only each vertex's best token, whether it gives n-best lists and what
kind of decoder output it needs. The models (which strategies they offer), the pipeline (the one
check of a request, :func:`fadat.translation.pipeline.check_strategy`), the command line
(``--strategy`` choices and help) and the server (request checks, ``GET /health``) read these
records; no other module knows a strategy's quirks.

A model offers the strategies whose :attr:`Strategy.needs` is its ``decoder_kind``
(:func:`offered`):

- :data:`GRAPH`: a DAG (token log-probabilities per vertex and links; the DAT): the decoders of
  :mod:`fadat.decoding`;
- :data:`AUTOREGRESSIVE`: an incremental decoder (the AT): its greedy and beam searches;
- :data:`POSITIONS`: independent per-position token distributions (the NAT, CTC): the argmax.

Two strategies of different kinds may share a name (``greedy`` and ``beam`` of the DAT and AT):
a model offers at most one strategy of each name.

To add a strategy: its function (for a DAG decoder, one module of :mod:`fadat.decoding`), one
record here and one line in :data:`REGISTRY` (docs/extending.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fadat.decoding.beam import beam_search
from fadat.decoding.greedy import greedy, lookahead
from fadat.decoding.paths import Hypothesis
from fadat.decoding.sampling import sample
from fadat.decoding.viterbi import joint_viterbi, viterbi

#: A DAG: ``(token_logprobs (B, L, V), links (B, L, L))`` per sentence (DAT).
GRAPH = "graph"
#: An incremental decoder that extends a prefix one token at a time (AT).
AUTOREGRESSIVE = "autoregressive"
#: Independent token distributions at predicted or upsampled positions (NAT, CTC).
POSITIONS = "positions"
#: The decoder kinds a model may declare (``TranslationModel.decoder_kind``).
DECODER_KINDS = (GRAPH, AUTOREGRESSIVE, POSITIONS)


class StrategyError(ValueError):
    """A request a strategy cannot take: an unknown option, a value of the wrong type or out of
    range, an ``nbest`` it cannot give. The pipeline turns it into a
    :class:`fadat.errors.DecodingOptionError` (exit 2, HTTP 422)."""


@dataclass(frozen=True)
class StrategyOption:
    """One keyword option of a strategy.

    Attributes:
        name: the keyword (``top_p``); its command-line flag and HTTP field, where it has one,
            are in :data:`fadat.options.DECODING_OPTIONS`.
        type: ``int`` or ``float`` (a number; an ``int`` option takes integers only, not
            ``bool``), or ``object`` (anything, e.g. a KenLM model: no flag, no HTTP field).
        default: the value the strategy uses when the option is not given (``None``: off or
            unlimited; then ``None`` may also be given explicitly).
        low, high: the inclusive range of a number (``None`` = unbounded).
        low_open: ``low`` itself is excluded (``top_p`` in ``(0, 1]``).
    """

    name: str
    type: type
    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    @property
    def range_text(self) -> str:
        """``(0, 1]``, ``>= 1``, ``> 0`` or ``""`` (unbounded)."""
        if self.low is not None and self.high is not None:
            return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"<= {self.high:g}"
        return ""

    def check(self, value: Any) -> None:
        """Check one given value.

        Raises:
            StrategyError: ``None`` for an option whose default is not ``None``; not an integer
                (``int``) or not a finite number (``float``); outside the range.
        """
        if self.type is object or (value is None and self.default is None):
            return
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if self.type is int and not (number and isinstance(value, int)):
            raise StrategyError(f"{self.name} must be an integer, got {value!r}")
        if self.type is float and not (number and math.isfinite(value)):
            raise StrategyError(f"{self.name} must be a finite number, got {value!r}")
        below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        above = self.high is not None and value > self.high
        if below or above:
            raise StrategyError(f"{self.name} must be {self._must()}, got {value!r}")

    def _must(self) -> str:
        text = self.range_text
        return f"in {text}" if text.startswith(("(", "[")) else text


@dataclass(frozen=True)
class Strategy:
    """One decoding strategy.

    Attributes:
        name: what ``--strategy`` / ``strategy=`` / ``"strategy"`` call it.
        needs: the decoder kind it reads (:data:`GRAPH`, :data:`AUTOREGRESSIVE`,
            :data:`POSITIONS`); the models whose ``decoder_kind`` it is offer it.
        summary: one line for the documentation and ``--help``.
        fn: the DAG decoder ``fn(token_logprobs, links, graph_lengths, **options) ->
            list[Hypothesis]`` (:func:`fadat.decoding.decode` runs it); ``None`` where the
            model runs the strategy itself (``method``, or its ``translate_batch``).
        method: the model's method that runs it when ``fn`` is ``None`` (the AT's ``greedy``,
            ``beam_search``); ``""`` = ``translate_batch`` itself (the argmax).
        options: the keyword options it takes, with defaults and ranges.
        top1: it reads the token head only through each vertex's best token and its
            log-probability (:class:`fadat.decoding.VertexTop1`), so a DAT can skip the
            ``(B, L, V)`` log-probabilities and run with a shortlist or pruning
            (fadat.models.inference) ...
        top1_unless: ... unless one of these options is set to a true value (lookahead's
            n-gram bans read each vertex's top candidates).
        nbest: it gives n-best lists (``nbest > 1``, by repeated draws).
        check: a cross-option check after the per-option ones (raises :class:`StrategyError`).
    """

    name: str
    needs: str
    summary: str
    fn: Callable[..., list[Hypothesis]] | None = None
    method: str = ""
    options: tuple[StrategyOption, ...] = ()
    top1: bool = False
    top1_unless: tuple[str, ...] = ()
    nbest: bool = False
    check: Callable[[dict[str, Any]], None] | None = None

    @property
    def option_names(self) -> tuple[str, ...]:
        """The keywords it takes, in declaration order."""
        return tuple(o.name for o in self.options)

    @property
    def defaults(self) -> dict[str, Any]:
        """Keyword → default."""
        return {o.name: o.default for o in self.options}

    def reads_top1_only(self, options: dict[str, Any]) -> bool:
        """Whether it reads the token head only through ``s_v`` and the argmax token with
        ``options`` (see :attr:`top1`, :attr:`top1_unless`)."""
        return self.top1 and not any(options.get(name) for name in self.top1_unless)

    def check_request(self, options: dict[str, Any], nbest: int = 1) -> None:
        """The one check of a request's options and ``nbest`` (no decode is tried).

        Raises:
            StrategyError: an option it does not take, a value of the wrong type or out of
                range (:meth:`StrategyOption.check`), a cross-option problem (:attr:`check`), or
                ``nbest > 1`` for a strategy without :attr:`nbest`.
        """
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            takes = f"takes only {list(self.option_names)}" if self.options else "takes no options"
            raise StrategyError(f"strategy {self.name!r} {takes}, got {unknown}")
        by_name = {o.name: o for o in self.options}
        for name, value in options.items():
            by_name[name].check(value)
        if self.check is not None:
            self.check(options)
        if nbest > 1 and not self.nbest:
            raise StrategyError(
                f"--nbest {nbest}: strategy {self.name!r} gives one hypothesis per sentence"
            )


# ----------------------------------------------------------------------------------------------
# The options (shared by several strategies where they mean the same)

_BETA = StrategyOption("beta", float, 1.0)
_TOP_CAND_N = StrategyOption("top_cand_n", int, 5, low=1)
_TOP_P = StrategyOption("top_p", float, 0.9, low=0.0, high=1.0, low_open=True)
_NO_REPEATED_NGRAM = StrategyOption("no_repeated_ngram", int, 0, low=0)
_LENGTH_PENALTY = StrategyOption("length_penalty", float, 1.0)
_MAX_LENGTH = StrategyOption("max_length", int, None, low=1)
_MAX_LEN_A = StrategyOption("max_len_a", float, 1.2, low=0.0)
_MAX_LEN_B = StrategyOption("max_len_b", int, 10, low=0)
_BANS = ("no_consecutive_repeated_ngram", "no_repeated_ngram")


def _check_language_model(options: dict[str, Any]) -> None:
    """The DAG beam search's ``lm`` needs ``lm_words`` (whether a file needs the optional
    ``kenlm`` package, a KenLM binary, is for :func:`fadat.engine.beam_np.open_model` to say);
    ``gamma``, the LM's weight, needs ``lm`` (without one it would be ignored)."""
    if options.get("lm") is None:
        if options.get("gamma") is not None:
            raise StrategyError(
                "gamma (--gamma) weighs the language model lm (--lm) and does nothing without "
                "one; give a language model or leave gamma out"
            )
        return
    if options.get("lm_words") is None:
        raise StrategyError("lm_words (the LM word of each token id) is required with lm")


# ----------------------------------------------------------------------------------------------
# The records

GREEDY = Strategy(
    "greedy",
    GRAPH,
    "follow each vertex's most likely link",
    fn=greedy,
    top1=True,
)
LOOKAHEAD = Strategy(
    "lookahead",
    GRAPH,
    "follow the link that maximises link + β·token score",
    fn=lookahead,
    options=(
        _BETA,
        _TOP_CAND_N,
        # only read with n-gram bans: the skipped-mass threshold, any finite number
        StrategyOption("top_p", float, 0.9),
        StrategyOption("no_consecutive_repeated_ngram", int, 0, low=0),
        _NO_REPEATED_NGRAM,
    ),
    top1=True,
    top1_unless=_BANS,
)
VITERBI = Strategy(
    "viterbi",
    GRAPH,
    "the most likely path of each length, ranked by links, length-normalised",
    fn=viterbi,
    options=(_LENGTH_PENALTY, _MAX_LENGTH),
    top1=True,
)
JOINT_VITERBI = Strategy(
    "joint-viterbi",
    GRAPH,
    "the most likely path and tokens of each length, length-normalised",
    fn=joint_viterbi,
    options=(_LENGTH_PENALTY, _MAX_LENGTH),
    top1=True,
)
SAMPLE = Strategy(
    "sample",
    GRAPH,
    "a random walk over (vertex, token) candidates; n-best by repeated draws",
    fn=sample,
    options=(
        StrategyOption("temperature", float, 1.0, low=0.0, low_open=True),
        _BETA,
        _TOP_CAND_N,
        _TOP_P,
        StrategyOption("seed", int, None, low=0),
        StrategyOption("no_consecutive_repeated_ngram", int, 1, low=0),
        _NO_REPEATED_NGRAM,
    ),
    nbest=True,
)
BEAM = Strategy(
    "beam",
    GRAPH,
    "prefix-merging beam search over the DAG, optionally with an n-gram LM",
    fn=beam_search,
    options=(
        StrategyOption("beam_size", int, 100, low=1),
        StrategyOption("max_beam_per_length", int, 10, low=1),
        _TOP_CAND_N,
        _TOP_P,
        StrategyOption("max_successors", int, 5, low=1),
        StrategyOption("alpha", float, 1.1),
        StrategyOption("lm", object, None),
        StrategyOption("lm_words", object, None),
        StrategyOption("gamma", float, 0.1),
    ),
    check=_check_language_model,
)
AT_GREEDY = Strategy(
    "greedy",
    AUTOREGRESSIVE,
    "the most likely next token at each step",
    method="greedy",
    options=(_LENGTH_PENALTY, _MAX_LEN_A, _MAX_LEN_B),
)
AT_BEAM = Strategy(
    "beam",
    AUTOREGRESSIVE,
    "beam search with length penalty α",
    method="beam_search",
    options=(StrategyOption("beam_size", int, 5, low=1), _LENGTH_PENALTY, _MAX_LEN_A, _MAX_LEN_B),
)
ARGMAX = Strategy("argmax", POSITIONS, "the most likely token at each position")

#: ``(needs, name)`` → record: one line per strategy, in the order of ``--help``.
REGISTRY: dict[tuple[str, str], Strategy] = {
    (s.needs, s.name): s
    for s in (
        GREEDY,
        LOOKAHEAD,
        VITERBI,
        JOINT_VITERBI,
        SAMPLE,
        BEAM,
        AT_GREEDY,
        AT_BEAM,
        ARGMAX,
    )
}


def offered(decoder_kind: str) -> dict[str, Strategy]:
    """The strategies a model of ``decoder_kind`` offers, name → record, in registry order.

    Raises:
        ValueError: ``decoder_kind`` is none of :data:`DECODER_KINDS`.
    """
    if decoder_kind not in DECODER_KINDS:
        raise ValueError(
            f"decoder kind must be one of {', '.join(DECODER_KINDS)}, got {decoder_kind!r}"
        )
    return {s.name: s for s in REGISTRY.values() if s.needs == decoder_kind}


def strategy_names() -> tuple[str, ...]:
    """Every strategy name, each once, in registry order (the ``--strategy`` choices)."""
    return tuple(dict.fromkeys(s.name for s in REGISTRY.values()))
