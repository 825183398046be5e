"""Is the server's ``confidence`` a quality estimate? Spearman's ρ against sentence-level chrF.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/qe_confidence.py \\
        --model models/bible-en-es-fadat-cpu-small --data /work/data/bible-en-es --split test \\
        [--strategy lookahead] [--subset 0] [--output qe.tsv]

Translates every source sentence of the split with :meth:`fadat.serve.engine.Engine.translate`
(the code path of ``POST /v1/translate``), scores each output against its reference(s) with
sacreBLEU's sentence-level chrF, and prints Spearman's ρ (with a 95 % percentile bootstrap
interval over sentences, 1,000 resamples) between chrF and:

- ``confidence`` — the server's score, ``exp(log P(y|x) / T)``
  (:func:`fadat.serve.engine.confidence`);
- ``log P(y|x)`` — the same log-probability, not normalised by length;
- ``decoder score`` — the strategy's own score (``Translation.score``);
- ``−source length`` — a baseline that knows nothing of the model: shorter sources are easier.

``--output`` writes one row per sentence (source, reference, output, chrF, confidence, log P,
score) for inspection.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from sacrebleu.metrics import CHRF

from fadat.evaluation.scoring import load_split
from fadat.serve.engine import Engine
from fadat.serve.quality import bootstrap_interval, spearman


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--subset", type=int, default=0, help="first N sentences (0 = all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None, help="per-sentence TSV")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    engine = Engine.from_directory(args.model)
    strategy, options = engine.check(args.strategy, {})
    sources, references = load_split(args.data, args.split, args.subset)
    start = time.perf_counter()
    results = []
    chunk = 128
    for k in range(0, len(sources), chunk):
        results += engine.translate(sources[k : k + chunk], strategy, options, max_tokens=4096)
        print(f"  {len(results)}/{len(sources)} sentences", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start

    chrf = CHRF()
    rows = [i for i, r in enumerate(results) if r.confidence is not None]
    quality = [
        chrf.sentence_score(results[i].text, [stream[i] for stream in references]).score
        for i in rows
    ]
    predictors = {
        "confidence exp(log P(y|x)/T)": [results[i].confidence for i in rows],
        "log P(y|x)": [
            results[i].log_prob if results[i].log_prob is not None else -math.inf for i in rows
        ],
        "decoder score": [
            results[i].score if results[i].score is not None else -math.inf for i in rows
        ],
        "-source length (chars)": [-len(sources[i]) for i in rows],
    }
    confidences = predictors["confidence exp(log P(y|x)/T)"]
    print(
        f"model {args.model} ({engine.model_type}), {args.split} split, {len(rows)} sentences, "
        f"strategy {strategy}; translated and scored in {seconds:.0f} s on {args.threads} "
        "thread(s) (other work shared the machine)"
    )
    print(
        f"mean confidence {sum(confidences) / len(confidences):.3f} "
        f"(min {min(confidences):.3f}, max {max(confidences):.3f}); "
        f"mean sentence chrF {sum(quality) / len(quality):.2f}"
    )
    print()
    print("| predictor of sentence chrF | Spearman rho | 95% bootstrap interval |")
    print("|---|---|---|")
    for name, values in predictors.items():
        rho = spearman(values, quality)
        low, high = bootstrap_interval(values, quality)
        print(f"| {name} | {rho:+.3f} | [{low:+.3f}, {high:+.3f}] |")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write("source\treference\toutput\tchrf\tconfidence\tlog_prob\tscore\n")
            for i, q in zip(rows, quality, strict=True):
                r = results[i]
                out.write(
                    f"{sources[i]}\t{references[0][i]}\t{r.text}\t{q:.2f}\t{r.confidence:.6f}\t"
                    f"{r.log_prob}\t{r.score}\n"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
