"""``fadat score``: ``log P(y|x)`` and the per-token NLL of given (source, target) pairs.

DAT: paper Eq. 3 (the sum over every path through the graph with ``|<s> y </s>|`` vertices),
computed by :func:`fadat.dag.dag_log_likelihood` on the graph that ``fadat translate`` decodes.
AT: ``Σ_t log P(y_t | y_<t, x)`` over ``y </s>``. The pipeline is
:func:`fadat.translation.pipeline.score_pairs` (from Python: :meth:`fadat.Translator.score`);
this module is the command line only.

Input: ``--source FILE --target FILE`` (parallel, one sentence per line) or, without them,
tab-separated ``SOURCE<TAB>TARGET`` lines on stdin / ``--input``. Output: one line per pair,
``LOG_PROB<TAB>NLL_PER_TOKEN`` (nats; ``-inf``/``inf`` when the DAT graph is too small for the
target, ``nan`` when an AT model cannot score it; a warning names the line).
"""

from __future__ import annotations

import argparse

from fadat.cli.common import (
    add_common_arguments,
    add_force_argument,
    check_output,
    open_output,
    stderr_warner,
)
from fadat.data.text import read_lines
from fadat.errors import InputError
from fadat.models.directory import load_model
from fadat.process import apply_threads
from fadat.translation.pipeline import score_pairs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat score``."""
    parser.description = (
        "Score (source, target) pairs with a DAT or AT model: prints "
        "'LOG_PROB<TAB>NLL_PER_TOKEN' per pair (log P(y|x) in nats; per-token NLL = "
        "-log P / tokens, tokens = |<s> y </s>| for DAT, |y </s>| for AT)."
    )
    parser.add_argument("--model", required=True, help="model directory (save_pretrained)")
    parser.add_argument("--source", default=None, help="source sentences, one per line")
    parser.add_argument("--target", default=None, help="target sentences, one per line")
    parser.add_argument(
        "--input",
        default=None,
        help="without --source/--target: SOURCE<TAB>TARGET lines from this file (default stdin)",
    )
    parser.add_argument("--output", default=None, help="output file (default: stdout)")
    add_force_argument(parser)
    add_common_arguments(parser)


def read_pairs(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """Sources, targets and a name for warnings, from ``--source/--target`` or TSV input.

    Raises:
        InputError: only one of ``--source``/``--target``; files of different lengths; a TSV
            line without exactly one tab; unreadable or non-UTF-8 input.
    """
    if (args.source is None) != (args.target is None):
        raise InputError("give both --source and --target, or neither (TSV input)")
    if args.source is not None:
        if args.input is not None:
            raise InputError("--input cannot be combined with --source/--target")
        sources, targets = read_lines(args.source, stdin=True), read_lines(args.target, stdin=True)
        if len(sources) != len(targets):
            raise InputError(
                f"{args.source} has {len(sources)} lines but {args.target} has {len(targets)}"
            )
        return sources, targets, args.source
    name = args.input or "<stdin>"
    sources, targets = [], []
    for number, line in enumerate(read_lines(args.input, stdin=True), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise InputError(
                f"{name}: line {number}: expected SOURCE<TAB>TARGET, found {len(fields)} field(s)"
            )
        sources.append(fields[0])
        targets.append(fields[1])
    return sources, targets, name


def run(args: argparse.Namespace) -> int:
    """``fadat score``: returns the exit code."""
    apply_threads(args.threads, args.force)
    check_output(
        args.output,
        [
            ("--input", args.input),
            ("--source", args.source),
            ("--target", args.target),
            ("--model", args.model),
        ],
        args.force,
    )
    model, sp = load_model(args.model, args.device)
    sources, targets, name = read_pairs(args)
    scores = score_pairs(
        model,
        sp,
        sources,
        targets,
        max_tokens=args.max_tokens,
        warn=stderr_warner(name),
        upsample_ratio=args.upsample_ratio,
    )
    with open_output(args.output) as out:
        for s in scores:
            out.write(f"{s.log_prob:.6f}\t{s.nll_per_token:.6f}\n")
    return 0
