"""What the ``fadat`` verbs share on their command-line side: ``--force``, checking and writing
``--output`` (a file written all-or-nothing, or stdout), warnings on stderr, the decoding-option
flags of every strategy and their help, and ``--device`` / ``--threads`` / ``--max-tokens`` /
``--upsample-ratio``. The argument parser and exit codes are :mod:`fadat.cli`'s; what the library
needs as well lives there (reading input lines: :func:`fadat.data.text.read_lines`; torch's
thread count: :func:`fadat.process.apply_threads`; output files: :mod:`fadat.outputs`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from torch import nn

from fadat import outputs
from fadat.errors import InputError
from fadat.options import (
    DECODING_OPTIONS,
    decoding_keywords,
    nonnegative_int,
    positive_float,
    probability,
    thread_count,
)
from fadat.translation.pipeline import DEFAULT_MAX_TOKENS, Warn


def add_force_argument(parser: argparse.ArgumentParser) -> None:
    """``--force`` (``args.force``), once per parser whichever helper asks for it first: it
    replaces an existing output file that fadat did not write, and lets ``--threads`` above the
    machine's cores through (:func:`fadat.process.apply_threads`)."""
    if "--force" not in parser._option_string_actions:  # argparse's own table of flags
        parser.add_argument(
            "--force",
            action="store_true",
            help="replace an existing output file that fadat did not write (never an input or "
            "a file of a model, dataset or run); use --threads above the machine's cores",
        )


def check_output(
    path: str | None, inputs: Iterable[tuple[str, str | None]] = (), force: bool = False
) -> None:
    """Before any work: ``--output`` names a file that can be written (stdout: nothing to check)
    and that is none of ``inputs`` (``(flag, path)`` of what the verb reads) and lies inside
    none of them; an existing file only if fadat wrote it, or with ``force``.

    Raises:
        InputError: a name ending in ``/``, a directory, an input or a file inside one, a file
            inside a fadat dataset, model or run, an existing file that fadat did not write
            (without ``force``), or a location that cannot be written
            (:func:`fadat.outputs.check_output_file`).
    """
    if path not in (None, "-"):
        outputs.check_output_file(path, "--output", inputs, force)


@contextmanager
def open_output(path: str | None) -> Iterator[TextIO]:
    """``sys.stdout`` (UTF-8) for ``None``/``"-"``, else a UTF-8 file written all-or-nothing: a
    temporary file next to ``path``, renamed onto it when the block ends without an error.

    Raises:
        InputError: stdout is closed; the file cannot be created or written (disk full, its
            directory removed: :func:`fadat.outputs.atomic_path`), or stdout cannot be written
            (a full device), naming the output and the OS error.
        BrokenPipeError: stdout is a pipe whose reading end was closed (``fadat.cli`` exits
            quietly).
    """
    if path in (None, "-"):
        if sys.stdout is None:
            raise InputError("stdout is closed; give --output FILE")
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(encoding="utf-8")
        try:
            yield sys.stdout
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            if err.filename is not None:  # not stdout's own error
                raise
            outputs.silence_stdout()  # or the interpreter's last flush fails again
            raise InputError(f"<stdout>: cannot write ({err.strerror or err})") from None
        return
    with outputs.atomic_path(path, "--output", record=True) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as out:
            yield out


def stderr_warner(source_name: str) -> Warn:
    """A :data:`Warn` that prints ``fadat: warning: <source_name>: <message>`` to stderr."""

    def warn(message: str) -> None:
        print(f"fadat: warning: {source_name}: {message}", file=sys.stderr)

    return warn


def strategies_by_architecture() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Architecture (``model_type``) → ``(default strategy, offered strategy names)``, from the
    models' ``decoder_kind`` and the records of :mod:`fadat.decoding.strategies`."""
    from fadat.models.architectures import ARCHITECTURES, model_class

    out = {}
    for model_type in ARCHITECTURES:
        cls = model_class(model_type)
        out[model_type] = (cls.default_strategy, tuple(cls.offered_strategies()))
    return out


def upsampled_architectures() -> list[str]:
    """``["DAT", "CTC"]``: the architectures that take a decoding λ (``upsampled``)."""
    from fadat.models.architectures import ARCHITECTURES, model_class

    return [t.upper() for t in ARCHITECTURES if model_class(t).upsampled]


def strategy_help(autoregressive: bool = True, defaults: bool = True) -> str:
    """The strategies of every architecture, for ``--help``: ``DAT: greedy, lookahead
    (default), …; AT: greedy, beam (default); NAT, CTC: argmax (default)`` (without the
    autoregressive ones when ``autoregressive`` is false, without the defaults' marks when
    ``defaults`` is false)."""
    from fadat.decoding.strategies import AUTOREGRESSIVE
    from fadat.models.architectures import model_class

    groups: dict[str, list[str]] = {}
    for model_type, (default, names) in strategies_by_architecture().items():
        if not autoregressive and model_class(model_type).decoder_kind == AUTOREGRESSIVE:
            continue
        text = ", ".join(f"{n} (default)" if defaults and n == default else n for n in names)
        groups.setdefault(text, []).append(model_type.upper())
    return "; ".join(f"{', '.join(types)}: {text}" for text, types in groups.items())


def nbest_strategies() -> str:
    """``DAT sample``: the strategies that give n-best lists, with their architectures."""
    from fadat.models.architectures import model_class

    found = []
    for model_type, (_, names) in strategies_by_architecture().items():
        offered = model_class(model_type).offered_strategies()
        found += [f"{model_type.upper()} {n}" for n in names if offered[n].nbest]
    return ", ".join(found) or "none"


def add_strategy_argument(parser: argparse.ArgumentParser) -> None:
    """``--strategy NAME``: its choices and help generated from the strategy records
    (:func:`fadat.decoding.strategies.strategy_names`, :func:`strategy_help`)."""
    from fadat.decoding.strategies import strategy_names

    parser.add_argument(
        "--strategy",
        default=None,
        choices=strategy_names(),
        metavar="NAME",
        help=f"decoding strategy: {strategy_help()}",
    )


def add_decoding_arguments(parser: argparse.ArgumentParser, language_model: bool = False) -> None:
    """Add the strategy option flags (all default ``None`` = the decoder's own default); with
    ``language_model``, also ``--lm FILE`` (``args.lm``) and the flags of the options that weigh
    it (``--gamma``: :data:`fadat.translation.language_model.WEIGHT_OPTIONS`), which are left out
    otherwise."""
    from fadat.translation.language_model import WEIGHT_OPTIONS

    group = parser.add_argument_group("decoding options (only those the strategy takes)")
    for name, option in DECODING_OPTIONS.items():
        if option.help is None or (name in WEIGHT_OPTIONS and not language_model):
            continue
        flag = "--" + name.replace("_", "-")
        if name == WEIGHT_OPTIONS[0]:  # --lm, then the flags that weigh it
            group.add_argument(
                "--lm",
                default=None,
                metavar="FILE",
                help="KenLM n-gram language model (ARPA or build_binary file) over the model's "
                "sentencepiece pieces, for the DAG beam search (DA-Transformer's "
                "--decode-lm-path; scripts/lm_corpus.py writes its training text; needs the lm "
                "extra)",
            )
        group.add_argument(flag, type=option.parse, default=None, help=option.help)


def decoding_options(args: argparse.Namespace, model: nn.Module, strategy: str) -> dict[str, Any]:
    """The strategy options the user set on the command line, as decoder keywords."""
    given = {
        name: getattr(args, name, None)
        for name, option in DECODING_OPTIONS.items()
        if option.help is not None
    }
    return decoding_keywords(given, model.flag_aliases.get(strategy))


def add_upsample_argument(parser: argparse.ArgumentParser) -> None:
    """``--upsample-ratio``: λ of the decoding graph (DA-Transformer's --decode-upsample-scale)."""
    parser.add_argument(
        "--upsample-ratio",
        type=positive_float,
        default=None,
        metavar="λ",
        help=f"{' and '.join(upsampled_architectures())}: decoder size L = λ·|x| at decoding "
        "(DA-Transformer's --decode-upsample-scale; default: the model's); refused for the "
        "other models, whose decoder length does not depend on it",
    )


def add_head_arguments(parser: argparse.ArgumentParser) -> None:
    """``--shortlist [FILE]`` and ``--prune-threshold τ``: less of a DAT's token head
    (fadat.models.inference; greedy, lookahead, viterbi, joint-viterbi)."""
    parser.add_argument(
        "--shortlist",
        nargs="?",
        const="model",
        default=None,
        metavar="FILE",
        help="DAT: take each vertex's best token over the sentence's lexical shortlist (`fadat "
        "shortlist`); without FILE the model directory's shortlist.safetensors (default off). "
        "--engine onnxruntime: an export runs the shortlist it was exported with (fadat export "
        "--format onnx --shortlist), which this only checks; a model directory is exported "
        "with it for the run",
    )
    parser.add_argument(
        "--prune-threshold",
        type=probability,
        default=None,
        metavar="τ",
        help="DAT: compute the token head only on vertices with passing probability >= τ "
        "(exact when the decoder's path stays on them; default off)",
    )


def add_threads_argument(
    parser: argparse.ArgumentParser, default: int = 0, onnxruntime: bool = False
) -> None:
    """``--threads N`` (torch's intra-op threads, :func:`fadat.process.apply_threads`; with
    ``onnxruntime``, said to be the onnxruntime engine's intra-op threads too) and ``--force``."""
    engine = "; also the onnxruntime engine's intra-op threads (0 = all cores)"
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=default,
        help=f"torch intra-op threads (0 = torch's default; default {default}"
        f"{engine if onnxruntime else ''}); more than the machine's cores needs --force",
    )
    add_force_argument(parser)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--threads`` (and ``--force``), ``--max-tokens``, ``--upsample-ratio``."""
    add_upsample_argument(parser)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps")
    add_threads_argument(parser)
    parser.add_argument(
        "--max-tokens",
        type=nonnegative_int,
        default=DEFAULT_MAX_TOKENS,
        help="batch budget in padded graph vertices (DAT) or source tokens (AT); "
        f"default {DEFAULT_MAX_TOKENS}",
    )
