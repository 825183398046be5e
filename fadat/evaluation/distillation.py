"""What sequence-level distillation changed in a training set: the statistics a KD dataset
is reported with (share of pairs changed, length ratio, BLEU of the teacher's targets against
the references), from the dataset before and after ``fadat distill``.

Kim & Rush (2016) and the NAT papers that train on distilled data (Gu et al. 2018; Zhou et al.
2020, "Understanding Knowledge Distillation in Non-autoregressive Machine Translation") report
the distilled targets through these quantities: how many targets the teacher rewrote, whether
its outputs are shorter than the references, and how far they are from them in BLEU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID
from fadat.errors import InputError


@dataclass(frozen=True)
class DistillationStatistics:
    """The distilled training targets against the original ones (one pair per sentence).

    Attributes:
        pairs: training pairs (the same sources, in the same order, in both datasets).
        changed: pairs whose target differs from the reference (compared as token ids).
        changed_share: ``changed / pairs`` (0–1).
        reference_pieces: sentencepiece pieces of the references, without ``<s>``/``</s>``.
        distilled_pieces: the same for the distilled targets.
        length_ratio: ``distilled_pieces / reference_pieces``.
        bleu: sacreBLEU (13a) of the detokenised distilled targets against the detokenised
            references, in BLEU points (0–100).
        tok_bleu: tokenized BLEU (Moses tokenizer; :func:`fadat.evaluation.scoring.corpus_scores`).
        bleu_signature: sacreBLEU's signature of ``bleu``.
        source_pairs: training pairs of the dataset distilled from; more than ``pairs`` when
            only its first ``pairs`` were distilled (``fadat distill --max-pairs``). ``None``
            in statistics recorded before fadat counted them.
    """

    pairs: int
    changed: int
    changed_share: float
    reference_pieces: int
    distilled_pieces: int
    length_ratio: float
    bleu: float
    tok_bleu: float
    bleu_signature: str
    source_pairs: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)

    def summary(self) -> str:
        """One line: pairs changed, length ratio, BLEU (and the pairs distilled of the
        dataset's when only the first were)."""
        line = (
            f"{self.changed:,} of {self.pairs:,} training targets changed "
            f"({100 * self.changed_share:.1f} %); length ratio {self.length_ratio:.3f} "
            f"(pieces, distilled / reference); BLEU against the references {self.bleu:.2f} "
            f"(tokenized {self.tok_bleu:.2f})"
        )
        if self.source_pairs is not None and self.source_pairs != self.pairs:
            line += f"; the first {self.pairs:,} of {self.source_pairs:,} training pairs only"
        return line


def _body(ids: Sequence[int]) -> list[int]:
    """Target ids without ``<s>``, ``</s>`` and ``<pad>``."""
    return [int(t) for t in ids if int(t) not in (BOS_ID, EOS_ID, PAD_ID)]


def target_statistics(
    references: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    spm_model: str | Path,
    target_lang: str,
    *,
    source_pairs: int | None = None,
) -> DistillationStatistics:
    """:class:`DistillationStatistics` of distilled ``targets`` against the ``references`` of
    the same sources (both token-id sequences, one per pair, ``<s>``/``</s>``/``<pad>``
    ignored), detokenised with the sentencepiece model ``spm_model`` for BLEU.
    ``source_pairs``: the training pairs of the dataset distilled from (``None``: as many as
    ``references``, the whole of it).

    Raises:
        ValueError: different numbers of references and targets, or more than
            ``source_pairs``.
    """
    import sentencepiece

    from fadat.evaluation.scoring import corpus_scores

    if len(references) != len(targets):
        raise ValueError(f"{len(references)} references but {len(targets)} targets")
    if source_pairs is None:
        source_pairs = len(references)
    if source_pairs < len(references):
        raise ValueError(f"{len(references)} pairs but source_pairs {source_pairs}")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    refs, hyps = [], []
    changed = reference_pieces = distilled_pieces = 0
    for reference, target in zip(references, targets, strict=True):
        ref, hyp = _body(reference), _body(target)
        changed += ref != hyp
        reference_pieces += len(ref)
        distilled_pieces += len(hyp)
        refs.append(sp.decode(ref))
        hyps.append(sp.decode(hyp))
    pairs = len(refs)
    scores = corpus_scores(hyps, [refs], target_lang)
    return DistillationStatistics(
        pairs=pairs,
        changed=changed,
        changed_share=changed / pairs if pairs else 0.0,
        reference_pieces=reference_pieces,
        distilled_pieces=distilled_pieces,
        length_ratio=distilled_pieces / reference_pieces if reference_pieces else float("nan"),
        bleu=float(scores["bleu"]),
        tok_bleu=float(scores["tok_bleu"]),
        bleu_signature=str(scores["bleu_signature"]),
        source_pairs=source_pairs,
    )


def distillation_statistics(
    original: str | Path, distilled: str | Path, *, target_lang: str | None = None
) -> DistillationStatistics:
    """Compare the training split of a prepared dataset with its distilled copy
    (:func:`target_statistics`; ``fadat distill`` records the same in the copy's ``meta.json``).

    Args:
        original: the dataset ``fadat distill --data`` read.
        distilled: the dataset it wrote (``--output``): same sources, targets rewritten; or
            the first of them only, when its ``meta.json`` says it distilled that many
            (``--max-pairs``).
        target_lang: ISO code of the target language for BLEU's tokenizers (``None``: the
            datasets' ``meta.json``).

    Returns:
        :class:`DistillationStatistics`.

    Raises:
        InputError: a dataset that does not load or names no languages; the two do not
            correspond (pair counts other than recorded, sources or sentencepiece models
            differ).
    """
    from fadat.data.binarized import BinarizedDataset
    from fadat.evaluation.scoring import read_languages

    original, distilled = Path(original), Path(distilled)
    model = original / "spm.model"
    try:
        same_model = model.read_bytes() == (distilled / "spm.model").read_bytes()
    except OSError as err:
        raise InputError(f"{err.filename}: cannot read the sentencepiece model") from None
    if not same_model:
        raise InputError(f"{distilled}: another sentencepiece model than {original}")
    before = BinarizedDataset(original, "train")
    after = BinarizedDataset(distilled, "train")
    max_pairs = after.meta.get("distilled", {}).get("settings", {}).get("max_pairs")
    if len(before) != len(after) and not (len(after) == max_pairs < len(before)):
        raise InputError(
            f"{distilled}: {len(after)} training pairs, {original} has {len(before)}: not its "
            "distilled copy"
        )
    if target_lang is None:
        target_lang = read_languages(original)[1]
    references, targets = [], []
    for i in range(len(after)):
        source, reference = before[i]
        source_kd, target = after[i]
        if not np.array_equal(source, source_kd):
            raise InputError(
                f"{distilled}: the source of training pair {i} differs from {original}'s: not "
                "its distilled copy"
            )
        references.append(reference.tolist())
        targets.append(target.tolist())
    return target_statistics(references, targets, model, target_lang, source_pairs=len(before))
