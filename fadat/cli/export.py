"""``fadat export``: its flags, mapped onto :func:`fadat.translation.export.export`."""

from __future__ import annotations

import argparse

from fadat.translation.export import FORMATS, QUANTIZATIONS, export


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fadat export``."""
    parser.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="ctranslate2: an AT for CTranslate2; onnx: a DAT for ONNX Runtime (docs/engine.md)",
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory")
    parser.add_argument("--output", required=True, metavar="DIR", help="directory to create")
    parser.add_argument(
        "--quantization",
        default="float32",
        choices=QUANTIZATIONS,
        help="ctranslate2: stored weight type (default float32; the engine can also quantize "
        "at load time)",
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "int8"),
        help="onnx: fp32 (default) or int8 (ONNX Runtime's dynamic quantization; the links "
        "head stays fp32)",
    )
    parser.add_argument(
        "--attention",
        default="fused",
        choices=("fused", "standard"),
        help="onnx: fused (default; one ONNX Runtime MultiHeadAttention op per attention block, "
        "the graph runs in ONNX Runtime only) or standard (standard ONNX ops, any runtime; "
        "slower in ONNX Runtime)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    parser.add_argument(
        "--shortlist",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="ctranslate2: write CTranslate2's vocabulary map (vmap.txt, use_vmap=True) from a "
        "shortlist (`fadat shortlist --model AT_DIR`; default AT_DIR/shortlist.safetensors)",
    )


def run(args: argparse.Namespace) -> int:
    """Export; returns 0. Raises InputError for bad input (see
    :func:`fadat.translation.export.export`)."""
    # A bare --shortlist (const "") is the model directory's own shortlist.
    shortlist = True if args.shortlist == "" else args.shortlist
    out = export(
        args.model,
        args.output,
        format=args.format,
        precision=args.precision,
        quantization=args.quantization,
        shortlist=shortlist,
        force=args.force,
        attention=args.attention,
    )
    if args.format == "onnx":
        what = f"onnx, {args.precision}, {args.attention} attention"
        print(f"exported {args.model} to {out} ({what})")
        return 0
    extra = ", vmap.txt from the shortlist" if shortlist is not None else ""
    print(f"exported {args.model} to {out} ({args.format}, {args.quantization}{extra})")
    return 0
