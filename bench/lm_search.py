"""The DAG beam search alone, with and without n-gram language models, on an ONNX Runtime
export's graph outputs: how much of a sentence's time the search and its LM take, and whether
two LM files (an ARPA file, read by fadat and looked up inside the compiled search, and the
same LM as a KenLM binary, scored by KenLM between the compiled steps) give the same
translations.

Usage (docs/results/lm-beam.md, "The n-gram lookups in compiled code")::

    taskset -c 0 python bench/lm_search.py --export EXPORT_DIR --data data/bible-en-es-4k \\
        --ratio 3 --sentences 300 --beam-size 20 --gamma 1.0 --repeats 5 \\
        --lm lm/kd.arpa lm/kd.bin

The graph runs once per sentence (batch 1, one thread; not timed); then each system (no LM,
then each ``--lm`` file) runs the search over all the sentences' arrays ``--repeats`` times
after one warm-up pass, and the table gives the median, min and max of the mean time per
sentence, in ms, on the wall clock. Opening each LM file is timed apart (CPU seconds of this
process). The hypotheses of every LM are compared with the first LM's: tokens and, to the last
bit, scores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from fadat.data.text import read_lines
from fadat.engine import beam_np
from fadat.engine.runtime import OnnxDAT


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, required=True, help="fadat export --format onnx")
    parser.add_argument(
        "--data", type=Path, required=True, help="data directory (raw/test.src.txt)"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--ratio", type=float, default=None, help="decoding λ (the export's)")
    parser.add_argument("--sentences", type=int, default=300, help="the first N (0 = all)")
    parser.add_argument("--beam-size", type=int, default=20)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lm", nargs="*", default=[], help="LM files (ARPA or KenLM binary)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.sentences < 0 or args.beam_size < 1:
        parser.error("--repeats and --beam-size must be >= 1, --sentences >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    source = args.data / "raw" / f"{args.split}.src.txt"
    lines = read_lines(source)
    if args.sentences:
        lines = lines[: args.sentences]
    engine = OnnxDAT(args.export, intra_threads=1)
    arrays = [engine.run_top_k(np.array([engine.encode(line)]), args.ratio) for line in lines]
    words = engine.lm_words()
    systems: list[tuple[str, object]] = [("no LM", None)]
    for path in args.lm:
        start = time.process_time()
        model = beam_np.open_model(path, "--lm")
        print(
            f"{path}: opened in {time.process_time() - start:.2f} s of CPU ({type(model).__name__})"
        )
        systems.append((str(path), model))

    def run(lm: object) -> list:
        kw = {"lm": lm, "lm_words": words, "gamma": args.gamma} if lm is not None else {}
        return [beam_np.beam_search(*a, beam_size=args.beam_size, **kw)[0] for a in arrays]

    print(
        f"{len(lines)} sentences of {source}, λ = {args.ratio or 'the export default'}, "
        f"beam {args.beam_size}, γ = {args.gamma}, {args.repeats} repeats"
    )
    print(f"{'system':<40} {'ms/sentence':>11} {'min':>7} {'max':>7}")
    outputs = {}
    for name, lm in systems:
        run(lm)  # warm-up: compiles or loads the compiled search
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            outputs[name] = run(lm)
            times.append(1000 * (time.perf_counter() - start) / len(lines))
        print(f"{name:<40} {statistics.median(times):>11.3f} {min(times):>7.3f} {max(times):>7.3f}")
    if len(systems) > 2:
        first = systems[1][0]
        for name, _ in systems[2:]:
            same = sum(
                a.tokens == b.tokens for a, b in zip(outputs[first], outputs[name], strict=True)
            )
            exact = sum(a == b for a, b in zip(outputs[first], outputs[name], strict=True))
            print(
                f"{name} against {first}: the same tokens for {same} of {len(lines)}, "
                f"identical hypotheses (scores to the last bit) for {exact}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
