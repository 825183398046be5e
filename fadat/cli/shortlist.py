"""``fadat shortlist``: its flags, mapped onto :func:`fadat.models.shortlist.shortlist`."""

from __future__ import annotations

import argparse
import json

from fadat.models.shortlist import (
    DEFAULT_FREQUENT,
    DEFAULT_TOP_K,
    SHORTLIST_NAME,
    load_shortlist,
    shortlist,
)
from fadat.options import nonnegative_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fadat shortlist``."""
    parser.description = (
        "Build a lexical vocabulary shortlist for a model from its training data and store it "
        f"in the model directory ({SHORTLIST_NAME}); a DAT uses it with `fadat translate "
        "--shortlist`, an AT exported to CTranslate2 as its vocabulary map (`fadat export "
        "--shortlist`)."
    )
    parser.add_argument("--model", required=True, help="DAT or AT model directory")
    parser.add_argument("--data", default=None, help="prepared data directory (fadat prepare)")
    parser.add_argument("--split", default="train", help="its split to count (default train)")
    parser.add_argument("--source", default=None, help="or: raw source text (one per line)")
    parser.add_argument("--target", default=None, help="and its raw target text")
    parser.add_argument(
        "--top-k", type=nonnegative_int, default=DEFAULT_TOP_K,
        help=f"candidates per source token (default {DEFAULT_TOP_K})",
    )  # fmt: skip
    parser.add_argument(
        "--frequent", type=nonnegative_int, default=DEFAULT_FREQUENT,
        help=f"most frequent target tokens always included (default {DEFAULT_FREQUENT})",
    )  # fmt: skip
    parser.add_argument(
        "--output",
        default=None,
        help=f"shortlist file to write elsewhere (default: MODEL/{SHORTLIST_NAME})",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --output file that fadat did not write (never an input or a "
        "file of a model, dataset or run)",
    )


def run(args: argparse.Namespace) -> int:
    """Build and write the shortlist (:func:`fadat.models.shortlist.shortlist`); returns 0."""
    out = shortlist(
        args.model,
        args.data,
        args.output,
        split=args.split,
        source=args.source,
        target=args.target,
        top_k=args.top_k,
        frequent=args.frequent,
        force=args.force,
    )
    metadata = load_shortlist(out).metadata
    summary = {k: metadata[k] for k in ("pairs", "top_k", "frequent")}
    print(f"wrote {out}: {json.dumps(summary)}")
    return 0
