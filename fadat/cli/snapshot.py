"""``fadat snapshot``: its flags, mapped onto :func:`fadat.training.snapshot.snapshot`."""

from __future__ import annotations

import argparse

from fadat.training.checkpoints import LAST_NAME, LIGHT_DTYPES
from fadat.training.snapshot import snapshot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fadat snapshot``."""
    parser.add_argument(
        "--run", required=True, metavar="RUN_DIR", help="run directory of fadat train"
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="the compact copy: a run directory to continue with fadat train --resume DIR "
        "--reset-optimizer (--data DATA for the run's dataset at another path: the copy records "
        "the sha256 of its training files)",
    )
    parser.add_argument(
        "--dtype",
        default="float16",
        choices=LIGHT_DTYPES,
        help="dtype of the stored weights (bfloat16 for weights beyond float16's ±65504; "
        "float32 keeps them exact); resuming casts them back to fp32",
    )
    parser.add_argument(
        "--with-best",
        action="store_true",
        help="also copy the run's best checkpoints (best.json's list), their weights in "
        "--dtype: the continued run keeps its best list, and fadat average --best K on the "
        "copy averages the same checkpoints as on the run (2 bytes per parameter each in "
        "float16)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing copy at --output (as a whole; refused while it holds files "
        "that fadat did not write there, such as checkpoints of a continued run)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the compact copy (:func:`fadat.training.snapshot.snapshot`); returns 0.

    Raises:
        InputError: as :func:`~fadat.training.snapshot.snapshot`.

    Warns:
        UnrecordedDatasetWarning: as :func:`~fadat.training.snapshot.snapshot` (one line on
            stderr, ``fadat: warning: ...``).
    """
    output = snapshot(
        args.run, args.output, dtype=args.dtype, force=args.force, with_best=args.with_best
    )
    size = (output / LAST_NAME).stat().st_size
    kept = "no best checkpoints"
    if args.with_best:
        best = list(output.glob("checkpoint_best_u*.pt"))
        kept = f"{len(best)} best checkpoint(s), {sum(p.stat().st_size for p in best) / 1e6:.1f} MB"
    print(
        f"wrote a compact copy of {args.run} to {args.output} ({LAST_NAME}: "
        f"{size / 1e6:.1f} MB, weights {args.dtype}, no optimizer state, {kept}); "
        f"continue it with: fadat train --resume {args.output} --reset-optimizer (and --data "
        "DIR where the run's dataset is at another path)"
    )
    return 0
