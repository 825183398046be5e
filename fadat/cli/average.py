"""``fadat average``: its flags, mapped onto :func:`fadat.training.average.average`."""

from __future__ import annotations

import argparse

from fadat.errors import InputError
from fadat.options import positive_int
from fadat.training.average import DTYPES, average


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fadat average``."""
    parser.add_argument("--run", metavar="RUN_DIR", help="run directory of fadat train")
    parser.add_argument(
        "--best", type=positive_int, default=5, help="average the K best (default 5)"
    )
    parser.add_argument(
        "--checkpoints", nargs="+", metavar="PT", help="average these checkpoint files instead"
    )
    parser.add_argument("--output", required=True, metavar="MODEL_DIR", help="model directory")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing model directory at --output (as a whole; refused while it "
        "holds files that fadat did not write there)",
    )
    parser.add_argument(
        "--data", help="data directory for spm.model and licence (default: the run's --data)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="dtype of the stored weights (float16 halves the file; loading casts back to fp32)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the averaged model directory (:func:`fadat.training.average.average`); returns 0.

    Raises:
        InputError: neither or both of --run/--checkpoints, and as
            :func:`~fadat.training.average.average`.
    """
    if bool(args.run) == bool(args.checkpoints):
        raise InputError("give exactly one of --run RUN_DIR or --checkpoints PT ...")
    average(
        args.run or args.checkpoints,
        args.output,
        best=args.best,
        data=args.data,
        dtype=args.dtype,
        force=args.force,
    )
    count = args.best if args.run else len(args.checkpoints)
    print(f"averaged {count} checkpoints into {args.output}")
    return 0
