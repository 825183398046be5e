"""``fadat distill``: its flags, mapped onto :func:`fadat.translation.distill.distill`."""

from __future__ import annotations

import argparse

from fadat.cli.common import add_force_argument
from fadat.data.binarized import read_meta
from fadat.options import MAX_THREADS, int_range, positive_int
from fadat.translation.distill import ENGINES, distill


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fadat distill``."""
    parser.add_argument("--model", required=True, metavar="AT_DIR", help="the AT teacher")
    parser.add_argument("--data", required=True, help="prepared dataset; its train split")
    parser.add_argument("--output", required=True, metavar="DATA_KD", help="dataset to write")
    parser.add_argument("--beam", type=int, default=5, help="beam size (1 = greedy; default 5)")
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument(
        "--threads",
        type=int_range(1, MAX_THREADS, "more than any machine's cores"),
        default=1,
        help="CPU threads (default 1); more than the machine's cores needs --force",
    )
    add_force_argument(parser)
    parser.add_argument(
        "--engine",
        default="auto",
        choices=ENGINES,
        help="fadat's beam search, or CTranslate2 (auto: CTranslate2 when installed)",
    )
    parser.add_argument(
        "--max-pairs",
        type=positive_int,
        default=None,
        metavar="N",
        help="distil only the first N training pairs; the output's training split holds only "
        "these (default: all; for smoke tests)",
    )
    parser.add_argument("--no-progress-bar", action="store_true", help="no tqdm bar")


def run(args: argparse.Namespace) -> int:
    """Distill; returns 0. Raises InputError for bad input (see
    :func:`fadat.translation.distill.distill`), or while another process distills into the
    same ``--output``."""
    result = distill(
        args.model,
        args.data,
        args.output,
        beam=args.beam,
        length_penalty=args.length_penalty,
        batch_size=args.batch_size,
        threads=args.threads,
        engine=args.engine,
        progress=not args.no_progress_bar,
        force=args.force,
        max_pairs=args.max_pairs,
    )
    if result.reused:
        print(f"{result.output}: already distilled with these settings")
    info = read_meta(result.output).get("distilled", {})
    rate = info.get("sentences_per_second_this_run")
    print(f"wrote {result.output} ({info.get('sentences')} sentences, {rate} sentences/s this run)")
    if result.statistics is not None:
        print(result.statistics.summary())
    return 0
