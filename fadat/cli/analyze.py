"""``fadat analyze``: the confidence tables and the vertex-density figure of DAT models (paper
§4.4) for a dataset split; the analyses are :mod:`fadat.evaluation.analysis`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fadat import outputs
from fadat.errors import InputError
from fadat.evaluation.analysis import (
    analyze_model,
    format_table3,
    format_table5,
    load_dat_model,
    plot_vertex_density,
)
from fadat.evaluation.scoring import DEFAULT_STRATEGIES
from fadat.options import nonnegative_int


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
    """``fadat analyze``: print Tables 3 and 5, write Figure 1 and the numbers as JSON."""
    from fadat.cli.common import decoding_options, stderr_warner
    from fadat.evaluation.scoring import load_split, read_languages
    from fadat.models.directory import model_labels
    from fadat.process import apply_threads
    from fadat.translation.pipeline import strategy_options

    apply_threads(args.threads, args.force)
    if args.names is not None and len(args.names) != len(args.model):
        raise InputError(f"--names has {len(args.names)} labels for {len(args.model)} models")
    if args.subset < 0:
        raise InputError(f"--subset must be >= 0, got {args.subset}")
    if args.max_tokens < 0:
        raise InputError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise InputError("--strategies is empty")
    out = Path(args.output_dir)
    # Before any work (fadat.outputs).
    outputs.check_not_input(
        out, [("--data", args.data), *(("--model", m) for m in args.model)], "--output-dir"
    )
    outputs.check_output_dir(out, "analysis", "--output-dir")
    names = args.names or model_labels(args.model)
    if len(set(names)) != len(names):
        raise InputError(f"model labels must differ, got {names}")
    sources, references = load_split(args.data, args.split, args.subset)
    _, target_lang = read_languages(args.data)
    reports = []
    for directory, name in zip(args.model, names, strict=True):
        model, sp = load_dat_model(directory, args.device)
        accepted = strategy_options(model)
        # Every strategy takes the user's flags that it accepts (as fadat evaluate does).
        options = {
            s: {
                k: v
                for k, v in decoding_options(args, model, s).items()
                if k in accepted.get(s, ())
            }
            for s in [*strategies, args.bucket_strategy]
        }
        reports.append(
            analyze_model(
                model,
                sp,
                name,
                sources,
                references,
                target_lang,
                strategies=strategies,
                bucket_strategy=args.bucket_strategy,
                options=options,
                max_tokens=args.max_tokens,
                warn=stderr_warner(f"{args.data} {args.split}"),
                upsample_ratio=args.upsample_ratio,
            )
        )
    outputs.mark_dir(out, "analysis")
    figure = out / "vertex_density.png"
    with outputs.atomic_path(figure) as tmp:
        plot_vertex_density([(r.name, r.passing, r.max_token) for r in reports], tmp)
    summary = {
        "data": str(args.data),
        "split": args.split,
        "target_lang": target_lang,
        "models": [r.summary() for r in reports],
    }
    outputs.atomic_write(out / "analysis.json", json.dumps(summary, indent=2) + "\n")
    print(
        f"Table 3: confidence of decoded outputs (nats per sentence; {reports[0].analysed} "
        f"sentences of {args.data} {args.split})\n"
    )
    print(format_table3(reports))
    print("\nTable 5: tokenized BLEU by reference length in 13a tokens (sentences)\n")
    print(format_table5(reports))
    print(f"\nFigure 1: {figure}\nnumbers: {out / 'analysis.json'}")
    return 0
