"""Scoring translations: sacreBLEU, chrF and tokenized BLEU with their signatures, BLEU per
reference-length bucket, sacreBLEU's paired bootstrap, the repetition rate, and reading a split's
raw sources and reference streams. Shared by ``fadat evaluate`` and ``fadat analyze``.

Tokenized BLEU is the NAT papers' number (docs/reference-behaviour.md, "Evaluation"): hypotheses
and references tokenised with sacremoses' ``MosesTokenizer`` (target language, no escaping) and
scored with ``tokenize="none"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacremoses import MosesTokenizer

from fadat.errors import InputError

# Reference-length bucket edges of the paper's Table 5: [0, 20), [20, 40), [40, 60), [60, inf).
BUCKET_EDGES: tuple[int, ...] = (20, 40, 60)
DEFAULT_STRATEGIES: tuple[str, ...] = ("greedy", "lookahead", "joint-viterbi")


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses-tokenise each line (sacremoses, ``escape=False``: no ``&amp;`` entities), the
    tokenisation of the NAT papers' tokenized BLEU (docs/reference-behaviour.md, "Evaluation")."""
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, return_str=True, escape=False) for line in lines]


def repetition_counts(tokenized: Sequence[str]) -> tuple[int, int]:
    """``(repeated, total)`` words of ``tokenized`` lines (space-separated tokens, e.g.
    :func:`moses_tokenize`'s): the words equal to the word before them in the same line, and all
    words. ``repeated / total`` is the repetition rate of the NAT papers' baseline tables (the
    paper's Table 2 baselines; docs/results/baselines.md)."""
    repeated = total = 0
    for line in tokenized:
        words = line.split()
        total += len(words)
        repeated += sum(a == b for a, b in pairwise(words))
    return repeated, total


def bleu_metric(target_lang: str) -> BLEU:
    """sacreBLEU with the default tokenizer for ``target_lang`` (13a, or zh/ja-mecab/ko-mecab)."""
    return BLEU(trg_lang=target_lang)


def tokenized_bleu_metric() -> BLEU:
    """BLEU on already (Moses-)tokenised text: ``tokenize="none"``."""
    return BLEU(tokenize="none", force=True)


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    target_lang: str,
    tokenized_hypotheses: Sequence[str] | None = None,
    tokenized_references: Sequence[Sequence[str]] | None = None,
) -> dict[str, Any]:
    """sacreBLEU, chrF and tokenized BLEU of one system, with signatures.

    Args:
        hypotheses: detokenised outputs, one per sentence.
        references: reference streams, each with one reference per sentence.
        target_lang: ISO code of the target language (tokenizers).
        tokenized_hypotheses: Moses-tokenised ``hypotheses`` (computed when ``None``).
        tokenized_references: Moses-tokenised ``references`` (computed when ``None``).

    Returns:
        ``{"bleu", "bleu_signature", "bleu_verbose", "chrf", "chrf_signature", "tok_bleu",
        "tok_bleu_signature"}`` (scores in BLEU/chrF points, 0–100).
    """
    refs = [list(stream) for stream in references]
    if tokenized_hypotheses is None:
        tokenized_hypotheses = moses_tokenize(hypotheses, target_lang)
    if tokenized_references is None:
        tokenized_references = [moses_tokenize(stream, target_lang) for stream in refs]
    bleu, chrf, tok = bleu_metric(target_lang), CHRF(), tokenized_bleu_metric()
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    tok_score = tok.corpus_score(
        list(tokenized_hypotheses), [list(s) for s in tokenized_references]
    )
    return {
        "bleu": bleu_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "bleu_verbose": str(bleu_score),
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf.get_signature()),
        "tok_bleu": tok_score.score,
        "tok_bleu_signature": str(tok.get_signature()) + " (sacremoses tokenizer)",
    }


def bucket_scores(
    tokenized_hypotheses: Sequence[str],
    tokenized_references: Sequence[Sequence[str]],
    first_references: Sequence[str],
    edges: Sequence[int] = BUCKET_EDGES,
) -> list[dict[str, Any]]:
    """Tokenized BLEU per reference-length bucket (paper Table 5).

    Args:
        tokenized_hypotheses: Moses-tokenised outputs.
        tokenized_references: Moses-tokenised reference streams (all are used for BLEU).
        first_references: the raw first reference stream (its 13a length picks the bucket).
        edges: bucket edges (default ``(20, 40, 60)``).

    Returns:
        ``[{"bucket": "< 20", "count": n, "tok_bleu": x or None}, …]``, one per bucket; the
        counts add up to the number of sentences.
    """
    buckets = length_buckets(reference_lengths(first_references), edges)
    out = []
    for k, label in enumerate(bucket_labels(edges)):
        members = [i for i, b in enumerate(buckets) if b == k]
        score = None
        if members:
            hyps = [tokenized_hypotheses[i] for i in members]
            refs = [[stream[i] for i in members] for stream in tokenized_references]
            score = tokenized_bleu_metric().corpus_score(hyps, refs).score
        out.append({"bucket": label, "count": len(members), "tok_bleu": score})
    return out


def paired_bootstrap(
    named_hypotheses: Sequence[tuple[str, Sequence[str]]],
    references: Sequence[Sequence[str]],
    metric: BLEU,
    samples: int = 1000,
) -> dict[str, dict[str, float | None]]:
    """sacreBLEU's paired bootstrap resampling of systems against the first one.

    Args:
        named_hypotheses: ``[(baseline name, hyps), (name, hyps), …]``.
        references: reference streams (tokenised the same way as the hypotheses).
        metric: a BLEU metric object (e.g. :func:`bleu_metric` or :func:`tokenized_bleu_metric`).
        samples: bootstrap resamples (sacreBLEU's default 1000).

    Returns:
        ``{name: {"score", "mean", "ci", "p_value"}}``; the baseline's ``p_value`` is None.
        sacreBLEU seeds its RNG with ``$SACREBLEU_SEED`` (default 12345).
    """
    test = PairedTest(
        [(name, list(h)) for name, h in named_hypotheses],
        {"BLEU": metric},
        [list(s) for s in references],
        test_type="bs",
        n_samples=samples,
    )
    _, scores = test()
    out = {}
    for name, result in zip(scores["System"], scores["BLEU"], strict=True):
        out[name] = {
            "score": result.score,
            "mean": result.mean,
            "ci": result.ci,
            "p_value": result.p_value,
        }
    return out


def reference_lengths(references: Sequence[str]) -> list[int]:
    """Length of each reference in tokens of sacreBLEU's ``13a`` tokenizer (words, punctuation
    split off), the tokens BLEU counts. The paper buckets by "reference length" without defining
    the unit; its references were Moses-tokenised words, which 13a approximates."""
    tokenize = Tokenizer13a()
    return [len(tokenize(ref).split()) for ref in references]


def length_buckets(lengths: Sequence[int], edges: Sequence[int] = BUCKET_EDGES) -> list[int]:
    """Bucket index of each length: bucket ``k`` holds ``edges[k-1] ≤ n < edges[k]`` (paper
    Table 5: ``< 20``, ``20 ≤ n < 40``, ``40 ≤ n < 60``, ``≥ 60``). Returns one index in
    ``0 … len(edges)`` per length. Raises ValueError if the edges do not increase."""
    if any(b <= a for a, b in pairwise(edges)):
        raise ValueError(f"bucket edges must increase: {list(edges)}")
    return [int(np.searchsorted(np.asarray(edges), n, side="right")) for n in lengths]


def bucket_labels(edges: Sequence[int] = BUCKET_EDGES) -> list[str]:
    """Human labels of the buckets of :func:`length_buckets`, e.g. ``["< 20", "20-40", …]``."""
    labels = [f"< {edges[0]}"]
    labels += [f"{a}-{b}" for a, b in pairwise(edges)]
    labels.append(f">= {edges[-1]}")
    return labels


def load_split(data_dir: str | Path, split: str, subset: int) -> tuple[list[str], list[list[str]]]:
    """Raw sources and reference streams of a split (first ``subset`` sentences if > 0).

    Raises:
        InputError: missing split, or reference streams of the wrong length.
    """
    from fadat.data.binarized import raw_references, raw_sources

    sources = list(raw_sources(data_dir, split))
    references = [list(stream) for stream in raw_references(data_dir, split)]
    if not references:
        raise InputError(f"{data_dir}: split {split!r} has no references")
    for k, stream in enumerate(references):
        if len(stream) != len(sources):
            raise InputError(
                f"{data_dir}: split {split!r}: reference stream {k} has {len(stream)} lines for "
                f"{len(sources)} sources"
            )
    if subset > 0:
        sources = sources[:subset]
        references = [stream[:subset] for stream in references]
    if not sources:
        raise InputError(f"{data_dir}: split {split!r} is empty")
    return sources, references


def read_languages(data_dir: str | Path) -> tuple[str, str]:
    """``(source_lang, target_lang)`` from the data directory's meta.json.

    Raises:
        InputError: meta.json missing or unreadable, or without the two keys.
    """
    from fadat.data.binarized import read_meta

    meta = read_meta(data_dir)
    try:
        return str(meta["source_lang"]), str(meta["target_lang"])
    except (KeyError, TypeError) as err:
        raise InputError(f"{Path(data_dir) / 'meta.json'}: no source_lang/target_lang") from err
