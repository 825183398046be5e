"""``fadat average``: average the best K checkpoints of a run (by validation BLEU) or a given list
of checkpoints into a model directory (docs/reference-behaviour.md, "Checkpoint averaging"; the
FA-DAT papers report best-5 averages).

The arithmetic lives in :mod:`fadat.checkpoints` (:func:`~fadat.checkpoints.average_checkpoints`,
:func:`~fadat.checkpoints.write_averaged_model`); this module is the command-line layer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fadat import outputs
from fadat.checkpoints import best_checkpoints, write_averaged_model
from fadat.errors import InputError
from fadat.options import positive_int
from fadat.train_config import load_yaml_config


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
        "--data", help="data directory for spm.model and licence (default: the run's --data)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float16", "bfloat16"),
        help="dtype of the stored weights (float16 halves the file; loading casts back to fp32)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the averaged model directory; returns 0.

    Raises:
        InputError: neither or both of --run/--checkpoints, --best < 1, bad checkpoints, or an
            --output that is not new, empty or a fadat model directory.
    """
    if bool(args.run) == bool(args.checkpoints):
        raise InputError("give exactly one of --run RUN_DIR or --checkpoints PT ...")
    if args.best < 1:
        raise InputError("--best must be >= 1")
    outputs.check_output_dir(args.output, "model", "--output")  # before any work
    data = args.data
    if args.run:
        paths = best_checkpoints(args.run, args.best)
        config = Path(args.run) / "config.yaml"
        if data is None and config.is_file():
            data = load_yaml_config(config).get("data")
    else:
        paths = [Path(p) for p in args.checkpoints]
    out = write_averaged_model(paths, args.output, data, weights_dtype=args.dtype)
    print(f"averaged {len(paths)} checkpoints into {out}")
    return 0
