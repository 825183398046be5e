"""``fadat analyze``: its flags, mapped onto :func:`fadat.evaluation.analysis.analyze` (the
confidence tables and the vertex-density figure of DAT models, paper §4.4), then Tables 3 and 5
printed and where Figure 1 and the numbers went.
"""

from __future__ import annotations

import argparse

from fadat.evaluation.analysis import analyze, format_table3, format_table5
from fadat.evaluation.scoring import DEFAULT_STRATEGIES
from fadat.options import DECODING_OPTIONS, nonnegative_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat analyze``."""
    from fadat.cli.common import add_common_arguments, add_decoding_arguments

    parser.description = (
        "Confidence of DAT models (paper §4.4): Table 3 (−log P(a|x), −log P(y|a,x), −log P(y|x) "
        "of decoded outputs), Figure 1 (passing vs max token probability of every vertex) and "
        "Table 5 (BLEU by reference length), several models side by side."
    )
    parser.add_argument(
        "--model",
        nargs="+",
        required=True,
        metavar="DIR",
        help="one or more DAT model directories, compared side by side",
    )
    parser.add_argument(
        "--names", nargs="+", metavar="NAME", help="labels of the models (default: directory names)"
    )
    parser.add_argument(
        "--data", required=True, metavar="DIR", help="data directory (fadat prepare)"
    )
    parser.add_argument("--split", default="test", help="split to analyse (default: test)")
    parser.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help="comma-separated decoding strategies of Table 3 "
        f"(default {','.join(DEFAULT_STRATEGIES)})",
    )
    parser.add_argument(
        "--bucket-strategy",
        default="lookahead",
        help="strategy scored per reference-length bucket (default: lookahead)",
    )
    parser.add_argument(
        "--subset", type=nonnegative_int, default=0, help="only the first N sentences"
    )
    parser.add_argument(
        "-o",
        "--output-dir",
        default="analysis",
        metavar="DIR",
        help="where vertex_density.png and analysis.json go (default: analysis)",
    )
    add_common_arguments(parser)
    add_decoding_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``fadat analyze``: analyse (:func:`fadat.evaluation.analysis.analyze`, which writes
    Figure 1 and the numbers as JSON), print Tables 3 and 5."""
    from fadat.cli.common import stderr_warner

    result = analyze(
        args.model,
        data=args.data,
        names=args.names,
        split=args.split,
        strategies=args.strategies,
        bucket_strategy=args.bucket_strategy,
        subset=args.subset,
        output_dir=args.output_dir,
        upsample_ratio=args.upsample_ratio,
        device=args.device,
        threads=args.threads,
        force=args.force,
        max_tokens=args.max_tokens,
        options={name: getattr(args, name) for name in DECODING_OPTIONS if hasattr(args, name)},
        warn=stderr_warner(f"{args.data} {args.split}"),
    )
    print(
        f"Table 3: confidence of decoded outputs (nats per sentence; {result.reports[0].analysed} "
        f"sentences of {args.data} {args.split})\n"
    )
    print(format_table3(result.reports))
    print("\nTable 5: tokenized BLEU by reference length in 13a tokens (sentences)\n")
    print(format_table5(result.reports))
    print(f"\nFigure 1: {result.figure}\nnumbers: {result.numbers}")
    return 0
