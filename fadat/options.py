"""Types for command-line option values: each rejects what the option cannot mean (NaN, an
infinity, a negative size) with an :class:`OptionValueError` naming the problem, which ``fadat``
prints as one line naming the option (exit 2), and which a library caller catches as an
:class:`~fadat.errors.InputError`.

Example::

    parser.add_argument("--beta", type=finite_float)
    parser.add_argument("--max-tokens", type=nonnegative_int)

And :data:`DECODING_OPTIONS`, the one table of the decoders' options that the command line
(``--beta`` …, :func:`fadat.cli.common.add_decoding_arguments`), the Python API
(:func:`fadat.translation.pipeline.check_option_values`) and the HTTP API (``"beta": …`` in a
request, :meth:`fadat.serve.engine.Engine.check`) read; :func:`check_threads`, the one check
of a thread count against the machine's cores.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fadat.errors import InputError, shown


class OptionValueError(InputError, argparse.ArgumentTypeError):
    """A value an option cannot take (``"nan"`` for ``--beta``, ``"-1"`` for a size): raised by
    this module's value types. An :class:`~fadat.errors.InputError` for the library (e.g.
    :func:`fadat.translation.pipeline.check_option_values`, which adds the option's name), and an
    ``argparse.ArgumentTypeError`` for the command line, whose parser then prints the message
    after the flag (``argument --beta: expected a finite number, got 'nan'``)."""


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        noun = "an integer" if kind is int else "a number"
        raise OptionValueError(f"expected {noun}, got {shown(text)}") from None
    if kind is float and not math.isfinite(value):
        raise OptionValueError(f"expected a finite number, got {shown(text)}")
    return value


def finite_float(text: str) -> float:
    """A finite number (no NaN, no infinity)."""
    return float(_number(text, float))


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise OptionValueError(f"must be > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0."""
    value = finite_float(text)
    if value < 0:
        raise OptionValueError(f"must be >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    value = finite_float(text)
    if not 0.0 <= value <= 1.0:
        raise OptionValueError(f"must be in [0, 1], got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(_number(text, int))
    if value < 1:
        raise OptionValueError(f"must be >= 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = int(_number(text, int))
    if value < 0:
        raise OptionValueError(f"must be >= 0, got {text!r}")
    return value


def int_range(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """The type of an integer option in ``[low, high]``; ``why`` (e.g. ``"torch's seed"``)
    is said in the message of a value above ``high``."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if value < low:
            raise OptionValueError(f"must be >= {low}, got {text!r}")
        if value > high:
            reason = f" ({why})" if why else ""
            raise OptionValueError(f"must be at most {high}{reason}, got {shown(text)}")
        return value

    return parse


#: The largest seed: torch's and numpy's generators take a signed 64-bit seed.
MAX_SEED = 2**63 - 1

#: A random seed: an integer in 0 … 2**63 − 1 (a larger one overflows in ``torch.manual_seed``).
random_seed = int_range(0, MAX_SEED, "a signed 64-bit seed")

#: The most threads an option may ask for, even with ``--force``: more than the hardware threads
#: of any machine today (a two-socket server has at most about 800), and far below the values
#: that overflow in ``torch.set_num_threads`` (2**31).
MAX_THREADS = 1024

#: A ``--threads`` value: an integer in 0 … :data:`MAX_THREADS` (0 = the library's default). How
#: it compares with the machine's cores is :func:`check_threads`'s.
thread_count = int_range(0, MAX_THREADS, "more than any machine's cores")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one, e.g.
    under ``taskset`` or a container's CPU set; else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_threads(threads: int, force: bool, name: str = "--threads") -> str | None:
    """Check a thread count against the cores this process may use (:func:`usable_cores`):
    more threads than cores share them and slow torch down (``--threads 1000`` on 2 cores made
    ``serve`` 80x and ``train`` 15x slower), so it takes ``force``.

    Args:
        threads: the count (0 = the library's default: always fine).
        force: the user insists (``--force``).
        name: the option, for the messages.

    Returns:
        A warning to show when ``force`` lets more threads than cores through, else ``None``.

    Raises:
        InputError: ``threads`` is negative or above :data:`MAX_THREADS`, or above the cores
            without ``force``.
    """
    if not 0 <= threads <= MAX_THREADS:
        raise InputError(f"{name} must be in [0, {MAX_THREADS}], got {threads}")
    cores = usable_cores()
    if threads <= cores:
        return None
    cores_text = f"{cores} CPU core{'s' * (cores > 1)}"
    problem = f"{name} {threads} is more than the {cores_text} this process may use"
    if not force:
        raise InputError(
            f"{problem}; more threads than cores slow torch down (give --force to use them anyway)"
        )
    return problem


def finite_float_list(text: str) -> list[float]:
    """Comma-separated finite numbers, at least one (``0.6,0.8,1``)."""
    values = [finite_float(part) for part in text.split(",") if part.strip()]
    if not values:
        raise OptionValueError(f"expected comma-separated numbers, got {text!r}")
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
#: that are not numbers are not here: the DAG beam search's KenLM model (``lm``, ``lm_words``)
#: is a file given to the verbs with ``--lm`` (:mod:`fadat.translation.language_model`), never a
#: field of an HTTP request.
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
    "seed": DecodingOption(int, random_seed, (0, MAX_SEED), "RNG seed (sample)"),
    "beam_size": DecodingOption(
        int, positive_int, (1, 200), "beam size (beam; AT default 5, DAG default 100)"
    ),
    "max_beam_per_length": DecodingOption(
        int, positive_int, (1, 100), "states kept per prefix length (DAG beam)"
    ),
    "gamma": DecodingOption(
        float,
        finite_float,
        (-10.0, 10.0),
        "γ: weight of the --lm language model's log10 score (DAG beam; default 0.1)",
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
    "max_successors": DecodingOption(int, positive_int, (1, 100)),
}


def decoding_keywords(
    options: Mapping[str, Any] | None, aliases: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Decoding options named as on the command line (``beta``, ``length_penalty``, ... : the
    keys of :data:`DECODING_OPTIONS`) as the keywords of one strategy: the names in ``aliases``
    (a model's ``flag_aliases[strategy]``, e.g. ``{"length_penalty": "alpha"}`` for the DAG beam
    search) renamed; ``None`` values (an option not set) left out. Values are not checked here
    (:func:`fadat.translation.pipeline.check_option_values`).

    Raises:
        InputError: a name that is not a decoding option.
    """
    unknown = [name for name in options or {} if name not in DECODING_OPTIONS]
    if unknown:
        raise InputError(
            f"unknown decoding option {unknown[0]!r}; choose from {', '.join(DECODING_OPTIONS)}"
        )
    keywords = {name: value for name, value in (options or {}).items() if value is not None}
    for flag, keyword in (aliases or {}).items():
        if flag in keywords:
            keywords[keyword] = keywords.pop(flag)
    return keywords
