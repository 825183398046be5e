"""``fadat translate``: the command line (arguments, reading the input, writing the output);
the translation itself is :func:`fadat.translation.pipeline.iter_translations`.
"""

from __future__ import annotations

import argparse
import sys

from fadat.cli.common import (
    add_common_arguments,
    add_decoding_arguments,
    add_force_argument,
    add_head_arguments,
    add_strategy_argument,
    check_output,
    decoding_options,
    nbest_strategies,
    open_output,
    stderr_warner,
)
from fadat.data.text import read_lines
from fadat.options import nonnegative_int, positive_int
from fadat.process import apply_threads
from fadat.translation.engines import DEFAULT_ENGINE, ENGINES, load_translation_model
from fadat.translation.language_model import check_takes_language_model, language_model_options
from fadat.translation.pipeline import (
    Translation,
    apply_reduced_head,
    check_strategy,
    check_upsample_ratio,
    iter_translations,
)

#: ``fadat translate``: lines translated (and written) at a time (see :func:`iter_translations`).
DEFAULT_CHUNK_LINES = 128


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
    add_force_argument(parser)
    add_strategy_argument(parser)
    parser.add_argument(
        "--nbest",
        type=positive_int,
        default=1,
        help=f"hypotheses per line (> 1: {nbest_strategies()} only)",
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
        default=None,
        choices=("fp32", "bf16", "int8"),
        help="DAT on CPU: weights in fp32 (default), bf16 or int8 (fadat.models.inference; test "
        "BLEU of each in docs/results/precision.md); --engine onnxruntime: fp32 or int8, default "
        "the export's",
    )
    parser.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        choices=ENGINES,
        help="auto (default): onnxruntime for an export of `fadat export --format onnx`, torch "
        "for a model directory; torch: the model in PyTorch; onnxruntime: an export (or a DAT "
        "model directory, exported first) run by ONNX Runtime, strategies greedy, lookahead, "
        "viterbi, joint-viterbi and beam (with --lm too) (docs/engine.md)",
    )
    add_head_arguments(parser)
    add_common_arguments(parser)
    add_decoding_arguments(parser, language_model=True)


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
    apply_threads(args.threads, args.force)
    check_output(args.output, [("--input", args.input), ("--model", args.model)], args.force)
    model, sp = load_translation_model(
        args.model,
        args.engine,
        args.device,
        args.precision,
        intra_threads=args.threads,
        cli=True,
        shortlist=args.shortlist,
    )
    model = apply_reduced_head(model, args.model, args.shortlist, args.prune_threshold, cli=True)
    strategy = args.strategy or model.default_strategy
    options = decoding_options(args, model, strategy)
    if args.lm is not None:  # opened once, before any input is read
        check_takes_language_model(model, [strategy], cli=True)
        options.update(language_model_options(args.lm, model, sp, cli=True))
    check_strategy(model, strategy, options, args.nbest, cli=True)
    check_upsample_ratio(args.upsample_ratio, model)
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
