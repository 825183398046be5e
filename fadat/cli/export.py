"""``fadat export``: its flags, mapped onto :func:`fadat.translation.export.export`."""

from __future__ import annotations

import argparse

from fadat.options import positive_int
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
    parser.add_argument(
        "--top-k",
        type=positive_int,
        default=None,
        metavar="K",
        help="onnx: each vertex's K best tokens in the graph's outputs, what the beam search "
        "reads (the most its --top-cand-n can be on the export; default 5, DAG-Search's "
        "--decode-top-cand-n)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    parser.add_argument(
        "--shortlist",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="a lexical shortlist (`fadat shortlist --model DIR`; without FILE "
        "DIR/shortlist.safetensors of --model): ctranslate2: CTranslate2's vocabulary map "
        "(vmap.txt, use_vmap=True); onnx: the graph's token head over each sentence's "
        "candidates, the file copied into the export (docs/engine.md)",
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
        top_k=args.top_k,
    )
    if args.format == "onnx":
        from fadat.engine.runtime import TOP_K

        k = TOP_K if args.top_k is None else args.top_k
        what = f"onnx, {args.precision}, {args.attention} attention, top {k} tokens per vertex"
        if shortlist is not None:
            what += ", shortlisted token head"
        print(f"exported {args.model} to {out} ({what})")
        return 0
    extra = ", vmap.txt from the shortlist" if shortlist is not None else ""
    print(f"exported {args.model} to {out} ({args.format}, {args.quantization}{extra})")
    return 0
