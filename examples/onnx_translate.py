"""Translate with a DAT exported by ``fadat export --format onnx``, with ONNX Runtime, numpy
and sentencepiece only: no torch (docs/engine.md).

    pip install onnxruntime numpy sentencepiece
    pip install --no-deps fadat        # the torch-free fadat.engine modules only
    python examples/onnx_translate.py EXPORT_DIR < input.en > output.es

The graph gives each vertex's best tokens and the links (fadat.translation.onnx_export); the
decoders are fadat.engine.decoding_np's numpy ones and fadat.engine.beam_np's beam search, the
same outputs as fadat's torch decoders. ``--strategy beam`` also needs ``pip install numba``
(and ``kenlm`` for a KenLM binary ``--lm``).
"""

from __future__ import annotations

import argparse
import sys

from fadat.engine.runtime import OnnxDAT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", help="directory written by fadat export --format onnx")
    parser.add_argument(
        "--strategy",
        default="lookahead",
        choices=("greedy", "lookahead", "viterbi", "joint-viterbi", "beam"),
    )
    parser.add_argument(
        "--lm", help="beam: an n-gram language model over the model's pieces (ARPA or KenLM binary)"
    )
    parser.add_argument("--gamma", type=float, default=0.1, help="beam: the LM's weight (0.1)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads (0 = all)")
    parser.add_argument("--batch", type=int, default=64, help="sentences per graph run")
    args = parser.parse_args(argv)
    engine = OnnxDAT(args.export, intra_threads=args.threads)
    lines = sys.stdin.read().splitlines()
    options = {"lm": args.lm, "gamma": args.gamma} if args.lm else {}
    for text in engine.translate(lines, args.strategy, max_sentences=args.batch, **options):
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
