"""Metrics against a known set of valid translations (corpora with ``raw/{split}.validset.jsonl``,
such as ``synth-multimodal``, :mod:`fadat.data.synth`).

For outputs ``h_i`` (whitespace-tokenized) and valid sets ``V_i``:

- ``exact_valid``: % of outputs that are in their valid set (decided exactly from the set's
  structure, :meth:`~fadat.data.synth.ValidSet.contains`);
- ``bleu_multi``: corpus BLEU (sacreBLEU, ``tokenize="none"``) with the listed valid translations
  of each sentence as its references (all of them when the set has at most the listing cap of
  combinations, else the listed uniform draws; the cap is ``SynthConfig.max_listed``);
- ``bleu_single``: the same BLEU against the single sampled reference (``raw/{split}.ref.txt``);
- ``repeated_tokens``: % of output tokens equal to the token before them;
- ``length_error`` / ``length_bias``: mean |len(h) − len(V)| and mean len(h) − len(V) in tokens
  (every valid translation of a sentence has the same length);
- ``mixtures``: outputs that are *not* valid but have at least one bigram, every one of which
  occurs in some valid translation of their sentence: the output stitches parts of several valid
  translations together (the multi-modality failure of non-autoregressive models). Reported as a
  count and as % of the outputs (``mixture_rate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU

from fadat.data.synth import ValidSet
from fadat.errors import InputError


def classify(hypothesis: str, valid: ValidSet) -> str:
    """``"valid"``, ``"mixture"`` or ``"other"`` for one output (definitions: module docstring)."""
    tokens = hypothesis.split()
    if valid.contains(tokens):
        return "valid"
    pairs = list(zip(tokens, tokens[1:], strict=False))
    if pairs and set(pairs) <= valid.bigrams():
        return "mixture"
    return "other"


def _bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU with a variable number of references per sentence."""
    width = max(len(r) for r in references)
    streams = [[r[k] if k < len(r) else None for r in references] for k in range(width)]
    return BLEU(tokenize="none").corpus_score(list(hypotheses), streams).score


def validset_scores(
    hypotheses: Sequence[str],
    valid_sets: Sequence[ValidSet],
    listed: Sequence[Sequence[str]],
    single: Sequence[str],
) -> dict[str, Any]:
    """The metrics of the module docstring for one system's outputs.

    Args:
        hypotheses: outputs, one string per sentence (tokens separated by spaces).
        valid_sets: the valid set of each sentence.
        listed: the listed valid translations of each sentence (≥ 1 each).
        single: the single reference of each sentence.

    Returns:
        ``exact_valid``, ``mixture_rate``, ``repeated_tokens`` (percent), ``mixtures`` (count),
        ``bleu_multi``, ``bleu_single``, ``length_error``, ``length_bias`` (tokens),
        ``references_per_sentence`` (mean number of listed references), ``sentences``.

    Raises:
        InputError: sequences of different lengths, or a sentence without listed references.
    """
    n = len(hypotheses)
    if not (len(valid_sets) == len(listed) == len(single) == n) or n == 0:
        raise InputError(
            f"valid-set metrics: {n} outputs, {len(valid_sets)} valid sets, {len(listed)} "
            f"reference lists, {len(single)} references"
        )
    if any(len(r) == 0 for r in listed):
        raise InputError("valid-set metrics: a sentence has no listed valid translation")
    kinds = [classify(h, v) for h, v in zip(hypotheses, valid_sets, strict=True)]
    tokens = [h.split() for h in hypotheses]
    repeated = sum(sum(a == b for a, b in zip(t, t[1:], strict=False)) for t in tokens)
    total = sum(len(t) for t in tokens)
    diffs = [len(t) - v.length() for t, v in zip(tokens, valid_sets, strict=True)]
    return {
        "sentences": n,
        "exact_valid": 100.0 * kinds.count("valid") / n,
        "mixtures": kinds.count("mixture"),
        "mixture_rate": 100.0 * kinds.count("mixture") / n,
        "bleu_multi": _bleu(hypotheses, listed),
        "bleu_single": _bleu(hypotheses, [[r] for r in single]),
        "repeated_tokens": 100.0 * repeated / total if total else 0.0,
        "length_error": sum(abs(d) for d in diffs) / n,
        "length_bias": sum(diffs) / n,
        "references_per_sentence": sum(len(r) for r in listed) / n,
    }


def load_valid_sets(
    data_dir: str, split: str, subset: int
) -> tuple[list[ValidSet], list[list[str]]] | None:
    """The valid sets and listed valid translations of a split (first ``subset`` if > 0), or
    None when the data directory has no valid sets for it."""
    from fadat.data.synth import read_listed_references, read_valid_sets

    sets = read_valid_sets(data_dir, split)
    if sets is None:
        return None
    listed = read_listed_references(data_dir, split)
    if subset > 0:
        sets, listed = sets[:subset], listed[:subset]
    return sets, listed


COLUMNS = (
    ("exact valid %", "exact_valid"),
    ("mixtures", "mixtures"),
    ("mixture %", "mixture_rate"),
    ("BLEU multi", "bleu_multi"),
    ("BLEU single", "bleu_single"),
    ("repeat %", "repeated_tokens"),
    ("len err", "length_error"),
    ("len bias", "length_bias"),
)


def format_table(systems: Sequence[dict[str, Any]]) -> list[str]:
    """Lines of the valid-set table for the systems of an evaluation report that have scores."""
    rows = [s for s in systems if "validset" in s]
    if not rows:
        return []
    header = ["system"] + [c for c, _ in COLUMNS]
    body = [
        [s["name"]]
        + [
            str(s["validset"][k]) if k == "mixtures" else f"{s['validset'][k]:.2f}"
            for _, k in COLUMNS
        ]
        for s in rows
    ]
    widths = [max(len(r[k]) for r in [header, *body]) for k in range(len(header))]
    lines = [
        "  ".join(
            c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    refs = rows[0]["validset"]["references_per_sentence"]
    return [
        "",
        "against the valid sets (exact membership; BLEU multi = sacreBLEU tok:none against "
        f"{refs:.1f} listed valid translations per sentence on average):",
        *lines,
    ]
