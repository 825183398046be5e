"""Types for command-line option values: each rejects what the option cannot mean (NaN, an
infinity, a negative size) with a message naming the problem, which ``fadat`` prints as one line
naming the option (exit 2).

Example::

    parser.add_argument("--beta", type=finite_float)
    parser.add_argument("--max-tokens", type=nonnegative_int)

And :data:`DECODING_OPTIONS`, the one table of the decoders' options that the command line
(``--beta`` …, :func:`fadat.verbs.add_decoding_arguments`), the Python API
(:func:`fadat.translation.pipeline.check_option_values`) and the HTTP API (``"beta": …`` in a
request, :meth:`fadat.serve.engine.Engine.check`) read.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """A finite number (no NaN, no infinity)."""
    return float(_number(text, float))


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    value = finite_float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def finite_float_list(text: str) -> list[float]:
    """Comma-separated finite numbers, at least one (``0.6,0.8,1``)."""
    values = [finite_float(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return values


@dataclass(frozen=True)
class DecodingOption:
    """One decoder option (a keyword of :func:`fadat.decoding.decode` or the AT's search).

    Attributes:
        kind: ``int`` or ``float``; an HTTP request gives ``int`` options as JSON integers,
            ``float`` options as any JSON number.
        parse: the value type (one of this module's) of the command-line flag; the Python API
            checks values with it too.
        http_range: the inclusive range an HTTP request may set (``fadat serve``); the upper
            bounds keep one request from occupying the server for minutes (a beam of 10⁶).
        help: the help of the command-line flag ``--NAME`` (dashes for underscores); ``None``
            for a keyword that has no flag of its own (the DAG beam search's ``alpha`` is set
            with ``--length-penalty``, see ``flag_aliases`` of the translation models).
    """

    kind: type
    parse: Callable[[str], Any]
    http_range: tuple[float, float]
    help: str | None = None


#: Decoder keyword → :class:`DecodingOption`, in the order of ``fadat translate --help``. The
#: types reject NaN, infinities and sizes below their minimum; each strategy's record
#: (:mod:`fadat.decoding.strategies`) holds its own ranges (``top_p`` in (0, 1], ...), checked by
#: :func:`fadat.translation.pipeline.check_strategy`. Options
#: that are not numbers (a KenLM model for the DAG beam search) are not here: no flag, no HTTP
#: field.
DECODING_OPTIONS: dict[str, DecodingOption] = {
    "beta": DecodingOption(
        float,
        finite_float,
        (0.0, 100.0),
        "β: weight of the token log-probability (lookahead, sample)",
    ),
    "length_penalty": DecodingOption(
        float,
        finite_float,
        (-10.0, 10.0),
        "length penalty: β_v of (joint-)viterbi, α of AT beam search and of DAG beam search",
    ),
    "temperature": DecodingOption(
        float, positive_float, (1e-3, 100.0), "τ: transition temperature (sample)"
    ),
    "top_cand_n": DecodingOption(
        int,
        positive_int,
        (1, 100),
        "candidates per vertex (sample, beam, lookahead with n-gram bans)",
    ),
    "top_p": DecodingOption(
        float,
        finite_float,
        (0.0, 1.0),
        "nucleus / candidate mass (sample, beam, lookahead with n-gram bans)",
    ),
    "seed": DecodingOption(int, nonnegative_int, (0, 2**63 - 1), "RNG seed (sample)"),
    "beam_size": DecodingOption(
        int, positive_int, (1, 200), "beam size (beam; AT default 5, DAG default 100)"
    ),
    "max_beam_per_length": DecodingOption(
        int, positive_int, (1, 100), "states kept per prefix length (DAG beam)"
    ),
    "no_consecutive_repeated_ngram": DecodingOption(
        int, nonnegative_int, (0, 10), "ban consecutive repeated n-grams up to this n"
    ),
    "no_repeated_ngram": DecodingOption(
        int, nonnegative_int, (0, 10), "ban repeating any n-gram of this order"
    ),
    "max_length": DecodingOption(
        int, positive_int, (1, 1024), "largest output length k (viterbi, joint-viterbi)"
    ),
    "max_len_a": DecodingOption(
        float, nonnegative_float, (0.0, 10.0), "AT output limit a·|x|+b: a"
    ),
    "max_len_b": DecodingOption(int, nonnegative_int, (0, 1024), "AT output limit a·|x|+b: b"),
    # keywords without a flag of their own (Python and HTTP only)
    "alpha": DecodingOption(float, finite_float, (-10.0, 10.0)),
    "gamma": DecodingOption(float, finite_float, (-10.0, 10.0)),
    "max_successors": DecodingOption(int, positive_int, (1, 100)),
}
