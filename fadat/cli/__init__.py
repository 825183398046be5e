"""``fadat <verb>``: a thin argparse layer. Each verb lives in its own module, which provides
``add_arguments(parser)`` and ``run(args) -> int``; this file holds no logic. A verb's module in
this package (``fadat.cli.translate``, ``fadat.cli.export``, …) maps its flags onto a typed
library function and prints; what the verbs share on the command line is
:mod:`fadat.cli.common`. ``python -m fadat.cli`` is :mod:`fadat.cli.__main__`.

Exit codes for every verb: 0 success, 2 bad input or an I/O failure (one line on stderr, no
traceback), 1 internal error, 130 interrupted (Ctrl-C, SIGTERM), 141 stdout closed by the
reading end of a pipe (quietly, as ``yes | head`` does).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from fadat.errors import FadatWarning, InputError
from fadat.outputs import silence_stdout
from fadat.process import terminate_as_interrupt, tune_memory

# verb -> (module, one-line help). Only the module of the verb that runs is imported.
VERBS: dict[str, tuple[str, str]] = {
    "prepare": (
        "fadat.cli.prepare",
        "build a dataset from parallel text or a built-in corpus",
    ),
    "train": (
        "fadat.cli.train",
        "train a DA-Transformer (--arch dat) or the AT baseline (--arch at)",
    ),
    "average": (
        "fadat.cli.average",
        "average the best checkpoints of a run into a model directory",
    ),
    "snapshot": (
        "fadat.cli.snapshot",
        "a compact copy of a run (fp16 weights, no optimizer state) to continue training from",
    ),
    "translate": ("fadat.cli.translate", "translate raw text with a DAT or AT model directory"),
    "score": ("fadat.cli.score", "log P(y|x) and per-token NLL of source/target pairs"),
    "evaluate": (
        "fadat.cli.evaluate",
        "BLEU, chrF, tokenized BLEU, latency and throughput of models",
    ),
    "analyze": (
        "fadat.cli.analyze",
        "confidence tables and vertex density plot of DAT models (§4.4)",
    ),
    "show-graph": (
        "fadat.cli.show_graph",
        "draw the DAG behind the translation of one sentence",
    ),
    "distill": (
        "fadat.cli.distill",
        "re-translate a dataset's training targets with an AT (KD)",
    ),
    "export": (
        "fadat.cli.export",
        "export a model to another inference engine (DAT: ONNX Runtime; AT: CTranslate2)",
    ),
    "shortlist": ("fadat.cli.shortlist", "build a lexical vocabulary shortlist for a DAT model"),
    "serve": ("fadat.cli.serve", "serve translations and the graph over HTTP, with a web page"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with fadat's error line: ``fadat: error: <problem>`` (one line, exit 2) instead
    of the usage text followed by the problem."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see {self.prog} --help)")

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, then :func:`refuse_empty_options` on this parser's options (each verb's
        parser runs it on its own)."""
        namespace, extras = super().parse_known_args(args, namespace)
        refuse_empty_options(self, namespace)
        return namespace, extras


def refuse_empty_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An option given an empty string (``--input ""``, an unset shell variable) is refused,
    naming the option: as a path it would be read as the current directory or as a missing
    file, and reported as another problem.

    Raises:
        InputError: naming the option.
    """
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        # a flag whose bare form means "" (nargs="?", const="": export --shortlist) is exempt
        if action.option_strings and "" not in (action.default, action.const) and "" in values:
            flag = max(action.option_strings, key=len)
            raise InputError(f"{flag} is empty (an empty string): give a value")


def one_line(message: str) -> str:
    """``message`` on one line (a library's multi-line error text joined by spaces)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def refuse_option_before_verb(argv: list[str]) -> None:
    """``fadat --threads 1 translate``: every option belongs to a verb, so one before the verb
    is refused naming it and where it goes (argparse would take its value for the verb and
    answer "invalid choice: '1'").

    Raises:
        InputError: the first argument is an option other than ``-h``/``--help``.
    """
    if not argv or not argv[0].startswith("-") or argv[0] in ("-h", "--help"):
        return
    option = argv[0].split("=", 1)[0]
    verb = next((a for a in argv if a in VERBS), None)
    where = f"after it: fadat {verb} {option} ..." if verb else "after a verb: fadat VERB OPTIONS"
    raise InputError(f"option {option} before the verb; options go {where} (see fadat --help)")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The ``fadat`` parser. Only ``verb``'s module is imported (to add its arguments), so
    ``fadat translate`` does not pay for importing training or plotting code."""
    parser = _Parser(
        prog="fadat",
        description="Non-autoregressive MT with Directed Acyclic Transformers (DA-T, FA-DAT).",
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, (module_name, help_text) in VERBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        if name == verb:
            importlib.import_module(module_name).add_arguments(p)
    return parser


#: OS errors that are bad luck (the disk, the file system), not bugs: one line and exit 2.
IO_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ENOSPC",
        "EDQUOT",
        "EFBIG",
        "EIO",
        "EROFS",
        "ENOENT",
        "ENOTDIR",
        "ESTALE",
        "EACCES",
        "EPERM",
        "ENXIO",
        "ENODEV",
    )
    if hasattr(errno, name)
)


def flush_stdout() -> None:
    """Flush stdout: what a verb printed must have arrived before it reports success.

    Raises:
        BrokenPipeError: the reading end of a pipe is closed.
        InputError: any other write error (a full device), naming stdout.
    """
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        silence_stdout()
        raise InputError(f"<stdout>: cannot write ({err.strerror or err})") from None


def _fadat_warnings_as_lines(show):
    """A ``warnings.showwarning`` that prints fadat's own warnings (:class:`FadatWarning`) as
    ``fadat: warning: <message>`` on stderr and passes the others to ``show``."""

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, FadatWarning):
            print(f"fadat: warning: {one_line(str(message))}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return showwarning


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fadat`` console script; returns the process exit code.

    Opts the process into :func:`fadat.process.tune_memory` (huge pages for torch's large CPU
    allocations, glibc keeping freed blocks) before any verb imports torch.
    """
    tune_memory()
    try:
        with terminate_as_interrupt(), warnings.catch_warnings():
            warnings.showwarning = _fadat_warnings_as_lines(warnings.showwarning)
            argv = sys.argv[1:] if argv is None else list(argv)
            refuse_option_before_verb(argv)
            verb = next((a for a in argv if not a.startswith("-")), None)
            args = build_parser(verb).parse_args(argv)
            code = int(importlib.import_module(args._module).run(args) or 0)
            flush_stdout()
            return code
    except InputError as err:
        print(f"fadat: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fadat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        silence_stdout()
        return 141
    except OSError as err:
        if err.errno not in IO_ERRNOS:
            raise
        where = f"{err.filename}: " if err.filename else ""
        print(f"fadat: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
