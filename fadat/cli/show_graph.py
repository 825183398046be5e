"""``fadat show-graph``: its flags and the run (:func:`fadat.evaluation.show_graph.show_graph`),
then the translation and the picture's path on stdout. What is drawn and how:
:mod:`fadat.evaluation.show_graph`.
"""

from __future__ import annotations

import argparse

from fadat.cli.common import (
    add_decoding_arguments,
    add_force_argument,
    add_upsample_argument,
    stderr_warner,
)
from fadat.evaluation.show_graph import MAX_TOP_K, show_graph
from fadat.options import DECODING_OPTIONS, int_range, probability


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat show-graph``."""
    parser.add_argument("sentence", help="the source sentence (raw text)")
    parser.add_argument("--model", required=True, metavar="DIR", help="DAT model directory")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="picture to write: FILE.png or FILE.svg",
    )
    add_force_argument(parser)
    parser.add_argument(
        "--strategy",
        default="lookahead",
        help="decoding strategy whose path is highlighted (default: lookahead)",
    )
    parser.add_argument(
        "--top-k",
        type=int_range(1, MAX_TOP_K, "the tokens listed in each vertex of the picture"),
        default=3,
        metavar="K",
        help=f"tokens listed per vertex (default: 3, at most {MAX_TOP_K})",
    )
    parser.add_argument(
        "--min-passing",
        type=probability,
        default=0.05,
        metavar="P",
        help="draw vertices with at least this passing probability (default: 0.05)",
    )
    parser.add_argument(
        "--min-flow",
        type=probability,
        default=0.05,
        metavar="P",
        help="draw transitions used by at least this share of paths (default: 0.05)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps")
    add_upsample_argument(parser)
    add_decoding_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``fadat show-graph``: translate one sentence, draw its graph, print the translation and
    where the picture went."""
    picture = show_graph(
        args.model,
        args.sentence,
        args.output,
        strategy=args.strategy,
        top_k=args.top_k,
        min_passing=args.min_passing,
        min_flow=args.min_flow,
        device=args.device,
        upsample_ratio=args.upsample_ratio,
        options={name: getattr(args, name) for name in DECODING_OPTIONS if hasattr(args, name)},
        force=args.force,
        warn=stderr_warner("sentence"),
    )
    print(picture.translation)
    print(f"graph: {args.output}")
    return 0
