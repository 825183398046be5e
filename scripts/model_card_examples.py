"""Example rows of a model card, chosen reproducibly: kept sentences, then percentiles of chrF.

    python scripts/model_card_examples.py --model MODEL_DIR --data DATA_DIR [--split test] \\
        [--strategy lookahead] [--words 10 25] [--percentiles 10 50 90] \\
        [--keep "SOURCE SENTENCE" ...] [--threads 1] [--markdown OUT.md]

Prints the Markdown of a model card's example table (``source | reference | this model``) after
one line that says how its rows were chosen:

1. Every source line of the split is translated by the model with ``--strategy`` as ``fadat
   evaluate --strategies STRATEGY`` translates it (:func:`translate_like_evaluate`: the same
   model loading, batches and default decoding options), at ``--threads`` torch threads. Give
   the thread count of the ``fadat evaluate`` run whose scores the card reports (the released
   model's card: ``--threads 1``).
2. Each output gets its sentence chrF: sacreBLEU's chrF2 with default settings, what
   ``sacrebleu.sentence_chrf`` computes, against every reference stream of the split (the
   corpus chrF ``fadat evaluate`` reports is the same metric over the whole split).
3. The candidates are the sentences whose source has between the two ``--words`` bounds of
   whitespace-separated words, bounds included; there are n of them. They are sorted by
   (chrF, line number), and percentile p is the candidate at 0-based position
   ``floor(p/100 · (n − 1) + 1/2)`` (:func:`choose`; computed in exact fractions, halves round
   up): p = 0 is the lowest chrF, p = 100 the highest, and equal scores are ordered by line.
4. The rows: the ``--keep`` sentences first (given by their exact source text, in the order
   given, e.g. the rows kept from the previous card; each is the split's first line with that
   text), then one row per percentile in the order given, its label in the source cell
   ("(10th pct.)", "(median)"). A sentence chosen twice is shown once, with every label it got.
   The reference cell shows the first reference stream.

Exit status 0, or 2 with a one-line ``model_card_examples: error: ...`` on stderr for bad input
(a missing model or data directory, a split the data directory lacks, a ``--keep`` text that is
not a source line of the split, a percentile outside 0–100, word bounds in the wrong order, no
candidate sentence). ``--markdown`` also writes the printed text to a file, all or nothing
(:func:`fadat.outputs.atomic_write`); never inside the model or data directory (a model's
``README.md`` is the card itself).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from fadat import outputs
from fadat.errors import InputError

if TYPE_CHECKING:
    from fadat.translation.translator import Translator

#: ``fadat evaluate``'s ``--batch-size`` default: the sentences per batch of its scored pass.
EVALUATE_BATCH_SIZE = 64
PROG = "model_card_examples"


@dataclass(frozen=True)
class Row:
    """One row of the example table.

    Attributes:
        index: 0-based line of the split.
        labels: the percentile labels of the row (``["10th pct."]``; empty for a kept row that
            no percentile chose).
        source, reference, output: the source line, its first reference, the model's output.
        chrf: the output's sentence chrF (0–100) against every reference stream.
    """

    index: int
    labels: tuple[str, ...]
    source: str
    reference: str
    output: str
    chrf: float


@dataclass(frozen=True)
class Examples:
    """The chosen rows and how they were chosen (:func:`select_examples`).

    Attributes:
        rows: kept rows first, then the percentile rows.
        candidates: n, the number of sentences within the word bounds.
        description: one Markdown line saying how the rows were chosen.
    """

    rows: tuple[Row, ...]
    candidates: int
    description: str


# ----------------------------------------------------------------------------------------------
# The selection (pure)


def check_percentiles(percentiles: Sequence[float]) -> list[float]:
    """The percentiles as floats. Raises InputError: none given, or one that is not a finite
    number in [0, 100]."""
    if not percentiles:
        raise InputError("--percentiles: give at least one percentile")
    out = []
    for p in percentiles:
        if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p):
            raise InputError(f"--percentiles must be numbers between 0 and 100, got {p!r}")
        if not 0 <= p <= 100:
            raise InputError(f"--percentiles must be between 0 and 100, got {p:g}")
        out.append(float(p))
    return out


def check_words(words: Sequence[int]) -> tuple[int, int]:
    """``(low, high)`` of the ``--words`` bounds. Raises InputError: not two integers
    ``0 <= low <= high``."""
    if len(words) != 2 or any(isinstance(w, bool) or not isinstance(w, int) for w in words):
        raise InputError(f"--words takes two integers LOW HIGH, got {list(words)}")
    low, high = words
    if low < 0 or low > high:
        raise InputError(f"--words {low} {high}: give LOW HIGH with 0 <= LOW <= HIGH")
    return low, high


def source_lengths(sources: Sequence[str]) -> list[int]:
    """Whitespace-separated words of each source line (``len(line.split())``)."""
    return [len(line.split()) for line in sources]


def candidates(lengths: Sequence[int], words: Sequence[int]) -> list[int]:
    """Indices of the lengths within the ``words`` bounds ``(low, high)``, both included, in
    order. Raises InputError: bad bounds (:func:`check_words`)."""
    low, high = check_words(words)
    return [i for i, n in enumerate(lengths) if low <= n <= high]


def percentile_position(p: float, n: int) -> int:
    """0-based position of percentile ``p`` (0–100) among ``n >= 1`` sorted items:
    ``floor(p/100 · (n − 1) + 1/2)``, in exact fractions (halves round up, whatever the float
    rounding of ``p/100``)."""
    return math.floor(Fraction(p) * (n - 1) / 100 + Fraction(1, 2))


def choose(
    scores: Sequence[float],
    lengths: Sequence[int],
    percentiles: Sequence[float],
    words: Sequence[int],
) -> list[int]:
    """The sentence at each percentile of ``scores`` among the candidates within ``words``.

    The candidates (:func:`candidates`) are sorted by ``(score, index)``, ascending; percentile
    p is the candidate at position :func:`percentile_position` ``(p, n)``.

    Args:
        scores: one score per sentence (sentence chrF).
        lengths: one length per sentence (source words), as many as ``scores``.
        percentiles: numbers in [0, 100], in the order wanted.
        words: ``(low, high)``, inclusive bounds on ``lengths``.

    Returns:
        One sentence index per percentile, in the order of ``percentiles`` (an index repeats
        when two percentiles fall on the same position).

    Raises:
        ValueError: ``scores`` and ``lengths`` differ in length.
        InputError: bad percentiles or bounds (:func:`check_percentiles`, :func:`check_words`),
            or no candidate.
    """
    if len(scores) != len(lengths):
        raise ValueError(f"{len(scores)} scores but {len(lengths)} lengths")
    percentiles = check_percentiles(percentiles)
    pool = candidates(lengths, words)
    if not pool:
        low, high = check_words(words)
        raise InputError(f"no sentence has {low}–{high} source words (--words {low} {high})")
    ranked = sorted(pool, key=lambda i: (scores[i], i))
    return [ranked[percentile_position(p, len(ranked))] for p in percentiles]


def percentile_label(p: float) -> str:
    """The label of a percentile row: ``"median"`` for 50, else ``"10th pct."``, ``"1st pct."``,
    ``"2.5th pct."``."""
    if p == 50:
        return "median"
    return f"{ordinal(p)} pct."


def ordinal(p: float) -> str:
    """``10`` → ``"10th"``, ``1`` → ``"1st"``, ``22`` → ``"22nd"``, ``13`` → ``"13th"``,
    ``2.5`` → ``"2.5th"``."""
    if p != int(p):
        return f"{p:g}th"
    n = int(p)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def keep_indices(sources: Sequence[str], keep: Sequence[str], where: str) -> list[int]:
    """The line index of each ``keep`` text: the first source line equal to it, exactly.

    Args:
        sources: the split's source lines.
        keep: source texts, in the order the rows are wanted.
        where: names the split in messages (its source file and split name).

    Raises:
        InputError: a text that is no source line of the split (naming ``where`` and the
            text), or one given twice.
    """
    first: dict[str, int] = {}
    for i, line in enumerate(sources):
        first.setdefault(line, i)
    out: list[int] = []
    for text in keep:
        if text not in first:
            raise InputError(f"{where}: --keep {text!r} is not a source line of the split")
        if first[text] in out:
            raise InputError(f"--keep {text!r} is given twice")
        out.append(first[text])
    return out


def table_rows(
    kept: Sequence[int], picks: Sequence[int], percentiles: Sequence[float]
) -> list[tuple[int, tuple[str, ...]]]:
    """``(index, labels)`` per row: the ``kept`` indices first (no label), then each pick in
    order with its :func:`percentile_label`; an index already listed gets the label added
    instead of a second row."""
    rows: dict[int, list[str]] = {i: [] for i in kept}
    for i, p in zip(picks, percentiles, strict=True):
        rows.setdefault(i, []).append(percentile_label(p))
    return [(i, tuple(labels)) for i, labels in rows.items()]


# ----------------------------------------------------------------------------------------------
# Translating and scoring


def translate_like_evaluate(
    translator: Translator,
    sources: Sequence[str],
    strategy: str,
    batch_size: int = EVALUATE_BATCH_SIZE,
) -> list[str]:
    """Each source's output as ``fadat evaluate`` computes it with this strategy.

    ``fadat evaluate`` translates the whole split in one call of
    :func:`fadat.translation.pipeline.translate_lines` with batches of ``--batch-size`` (64)
    sentences and no token budget (its ``--max-tokens 0``) and the strategy's default options;
    the same call is made here, so every sentence is padded and decoded in the same batch as
    there: the outputs are equal even where another batching (:meth:`fadat.Translator.translate`'s
    token budget) could tip a near tie between two tokens or paths.

    Args:
        translator: a :class:`fadat.Translator` (torch engine).
        sources: raw source lines (an empty line gives ``""``).
        strategy: a strategy the model supports.
        batch_size: sentences per batch (``fadat evaluate --batch-size``).

    Returns:
        One detokenised output per source, in order.

    Raises:
        InputError: as :meth:`fadat.Translator.translate` (unknown strategy, non-finite
            outputs), naming the line of ``sources``.
    """
    from fadat.translation.pipeline import translate_lines

    results = translate_lines(
        translator.model,
        translator.sp,
        sources,
        strategy=strategy,
        max_tokens=0,
        max_sentences=batch_size,
        upsample_ratio=translator.upsample_ratio,
    )
    return [hyps[0].text for hyps in results]


def sentence_scores(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]]
) -> tuple[list[float], str]:
    """Sentence chrF of each output against every reference stream, and the metric's signature.

    One ``sacrebleu.metrics.CHRF()`` with default settings scores each sentence
    (``sentence_score``): what ``sacrebleu.sentence_chrf`` computes, without building the metric
    once per sentence.

    Args:
        hypotheses: one output per sentence.
        references: reference streams, each with one line per sentence.

    Returns:
        ``(scores in chrF points 0–100, signature)``.
    """
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    scores = [
        metric.sentence_score(hyp, [stream[i] for stream in references]).score
        for i, hyp in enumerate(hypotheses)
    ]
    return scores, str(metric.get_signature()) if hypotheses else ""


# ----------------------------------------------------------------------------------------------
# The whole selection


def select_examples(
    model: str | Path,
    data: str | Path,
    *,
    split: str = "test",
    strategy: str = "lookahead",
    words: Sequence[int] = (10, 25),
    percentiles: Sequence[float] = (10, 50, 90),
    keep: Sequence[str] = (),
    threads: int = 1,
    log: Callable[[str], None] | None = None,
) -> Examples:
    """Translate a split with a model and choose the card's example rows (the module docstring).

    Args:
        model: a model directory (``fadat evaluate --model``).
        data: a dataset directory of ``fadat prepare`` (``raw/<split>.src.txt`` and its
            references, read as ``fadat evaluate`` reads them).
        split: the split.
        strategy: the decoding strategy.
        words: ``(low, high)`` source words of the candidates, inclusive.
        percentiles: percentiles of sentence chrF, each in [0, 100].
        keep: exact source texts of rows that come first.
        threads: torch's intra-op threads (0 = leave torch's setting).
        log: called with progress lines (default: none).

    Returns:
        The rows, n and the description line.

    Raises:
        InputError: bad percentiles or bounds, a missing or bad data directory or split, a
            ``keep`` text not in the split, a missing or bad model directory, an unknown
            strategy, no candidate sentence, a bad thread count.
    """
    import fadat
    from fadat.evaluation.scoring import load_split
    from fadat.process import apply_threads
    from fadat.translation.pipeline import check_strategy

    log = log or (lambda message: None)
    percentiles = check_percentiles(percentiles)
    low, high = check_words(words)
    sources, references = load_split(data, split, 0)
    where = f"{Path(data) / 'raw' / f'{split}.src.txt'} (split {split!r})"
    kept = keep_indices(sources, keep, where)
    lengths = source_lengths(sources)
    n = len(candidates(lengths, (low, high)))
    if not n:
        raise InputError(f"{where}: no sentence has {low}–{high} source words (--words)")
    apply_threads(threads)
    translator = fadat.Translator.from_pretrained(model, engine="torch")
    check_strategy(translator.model, strategy, {}, cli=True)
    log(f"translating {len(sources)} sentences of {split} with {strategy}")
    hypotheses = translate_like_evaluate(translator, sources, strategy)
    scores, signature = sentence_scores(hypotheses, references)
    picks = choose(scores, lengths, percentiles, (low, high))
    rows = tuple(
        Row(i, labels, sources[i], references[0][i], hypotheses[i], scores[i])
        for i, labels in table_rows(kept, picks, percentiles)
    )
    description = describe(
        split=split,
        strategy=strategy,
        kept=len(kept),
        percentiles=percentiles,
        n=n,
        words=(low, high),
        streams=len(references),
        signature=signature,
        merged=len(rows) < len(kept) + len(picks),
    )
    return Examples(rows, n, description)


def describe(
    *,
    split: str,
    strategy: str,
    kept: int,
    percentiles: Sequence[float],
    n: int,
    words: tuple[int, int],
    streams: int,
    signature: str,
    merged: bool,
) -> str:
    """The one Markdown line that says how the rows were chosen (strategy, split, kept rows,
    percentiles, n, word bounds, the chrF and the rule)."""
    ordinals = [ordinal(p) for p in percentiles]
    listed = ", ".join(ordinals[:-1]) + " and " + ordinals[-1] if len(ordinals) > 1 else ordinals[0]
    first = {0: "", 1: "the first row given by `--keep`, then "}.get(
        kept, f"the first {kept} rows given by `--keep`, then "
    )
    twice = " A sentence chosen twice is shown once, with each of its labels." if merged else ""
    return (
        f"Rows ({strategy}, split `{split}`): {first}the sentences at the {listed} percentile "
        f"of sentence chrF among the n = {n:,} sentences of {words[0]}–{words[1]} source words "
        "(whitespace-separated, bounds included). Sentence chrF: sacreBLEU chrF2, default "
        f"settings, against {streams} reference stream{'s' if streams != 1 else ''} "
        f"(`{signature}`); the candidates sorted by (chrF, line number), percentile p at "
        f"0-based position floor(p/100 · (n − 1) + 1/2).{twice}"
    )


def cell(text: str) -> str:
    """Text for a Markdown table cell: ``|`` escaped as ``\\|``."""
    return text.replace("|", "\\|")


def to_markdown(examples: Examples) -> str:
    """The description line, a blank line and the table ``source | reference | this model``
    (each percentile row's labels in parentheses after its source), newline-terminated."""
    lines = [examples.description, "", "| source | reference | this model |", "|---|---|---|"]
    for row in examples.rows:
        source = row.source + (f" ({', '.join(row.labels)})" if row.labels else "")
        lines.append(f"| {cell(source)} | {cell(row.reference)} | {cell(row.output)} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# The command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model directory")
    parser.add_argument("--data", required=True, help="a dataset directory of fadat prepare")
    parser.add_argument("--split", default="test", help="the split (test)")
    parser.add_argument("--strategy", default="lookahead", help="decoding strategy (lookahead)")
    parser.add_argument(
        "--words",
        nargs=2,
        type=int,
        default=[10, 25],
        metavar=("LOW", "HIGH"),
        help="source words of the candidates, bounds included (10 25)",
    )
    parser.add_argument(
        "--percentiles",
        nargs="+",
        type=float,
        default=[10.0, 50.0, 90.0],
        help="percentiles of sentence chrF, 0-100 (10 50 90)",
    )
    parser.add_argument(
        "--keep",
        nargs="+",
        action="extend",
        default=[],
        metavar="SOURCE",
        help="exact source lines to show first, in this order",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    parser.add_argument("--markdown", default=None, help="also write the Markdown to this file")
    args = parser.parse_args(argv)
    try:
        if args.markdown:
            inputs = [("--model", args.model), ("--data", args.data)]
            outputs.check_not_input(args.markdown, inputs, "--markdown")
        examples = select_examples(
            args.model,
            args.data,
            split=args.split,
            strategy=args.strategy,
            words=args.words,
            percentiles=args.percentiles,
            keep=args.keep,
            threads=args.threads,
            log=lambda message: print(f"{PROG}: {message}", file=sys.stderr, flush=True),
        )
        text = to_markdown(examples)
        if args.markdown:
            outputs.atomic_write(args.markdown, text, "--markdown")
    except InputError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
