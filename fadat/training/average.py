"""``fadat average``: average the best K checkpoints of a run (by validation BLEU) or a given list
of checkpoints into a model directory (docs/reference-behaviour.md, "Checkpoint averaging"; the
FA-DAT papers report best-5 averages).

The arithmetic lives in :mod:`fadat.training.checkpoints`
(:func:`~fadat.training.checkpoints.average_checkpoints`,
:func:`~fadat.training.checkpoints.write_averaged_model`); this module is the command-line layer.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from fadat import outputs
from fadat.errors import InputError
from fadat.options import positive_int
from fadat.training.checkpoints import best_checkpoints, write_averaged_model
from fadat.training.config import load_yaml_config


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
        choices=("float32", "float16", "bfloat16"),
        help="dtype of the stored weights (float16 halves the file; loading casts back to fp32)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the averaged model directory; returns 0.

    The model is built in a staging directory next to ``--output`` and renamed into place when
    complete (:func:`fadat.outputs.replace_dir`): an existing model directory (with or without
    fadat's marker) is replaced as a whole, and only with ``--force``.

    Raises:
        InputError: neither or both of --run/--checkpoints, --best < 1, bad checkpoints
            (non-finite weights included), an --output that is not new, empty or a fadat model
            directory, an existing model without --force, or an --output that is or lies inside
            an input (the run, a checkpoint, --data).
    """
    if bool(args.run) == bool(args.checkpoints):
        raise InputError("give exactly one of --run RUN_DIR or --checkpoints PT ...")
    if args.best < 1:
        raise InputError("--best must be >= 1")
    # Before any work (fadat.outputs).
    inputs = [("--run", args.run), ("--data", args.data)]
    inputs += [("--checkpoints", p) for p in args.checkpoints or []]
    outputs.check_not_input(args.output, inputs, "--output")
    if outputs.check_output_dir(args.output, "model", "--output"):
        if not args.force:
            raise InputError(
                f"--output {args.output}: an existing model directory; pass --force to replace "
                "it, or give another --output"
            )
        outputs.check_replaceable(args.output, "model", "--output")
    data = args.data
    if args.run:
        paths = best_checkpoints(args.run, args.best)
        config = Path(args.run) / "config.yaml"
        if data is None and config.is_file():
            data = load_yaml_config(config).get("data")
    else:
        paths = [Path(p) for p in args.checkpoints]
    staged = outputs.staging_dir(args.output)
    try:
        write_averaged_model(paths, staged, data, weights_dtype=args.dtype)
        outputs.replace_dir(staged, args.output, "model", "--output")
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    print(f"averaged {len(paths)} checkpoints into {args.output}")
    return 0
