"""The Python API of translation: :class:`Translator`, a model directory loaded once and
translated or scored with from Python (``fadat.Translator``). The pipeline it calls is
:mod:`fadat.translation.pipeline`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fadat.data.text import check_unicode
from fadat.errors import InputError
from fadat.models.directory import check_vocabulary
from fadat.translation.engines import DEFAULT_ENGINE, load_translation_model
from fadat.translation.pipeline import (
    DEFAULT_MAX_TOKENS,
    PairScore,
    Translation,
    apply_reduced_head,
    check_upsample_ratio,
    score_pairs,
    translate_lines,
)


class Translator:
    """Translate and score with a model directory from Python.

    Example::

        translator = fadat.Translator.from_pretrained("runs/fa-dat/model")
        translator.translate(["Hola mundo."], strategy="lookahead")

    Attributes:
        model: the loaded DAT or AT model (eval mode).
        sp: its sentencepiece processor.
        upsample_ratio: the decoding λ every call decodes and scores with (``None`` = the
            model's); passed as an argument, the model's config is not changed.

    Raises:
        InputError: as :func:`check_vocabulary` and :func:`check_upsample_ratio`.
    """

    def __init__(self, model: nn.Module, sp: Any, upsample_ratio: float | None = None) -> None:
        check_vocabulary(sp, model)
        check_upsample_ratio(upsample_ratio, model)
        self.model = model
        self.sp = sp
        self.upsample_ratio = upsample_ratio

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        device: str = "cpu",
        upsample_ratio: float | None = None,
        precision: str | None = None,
        shortlist: bool | str | Path | None = None,
        prune_threshold: float | None = None,
        engine: str = DEFAULT_ENGINE,
        intra_threads: int = 1,
    ) -> Translator:
        """Load a model directory (DAT or AT) onto ``device``; ``upsample_ratio`` is the
        decoding λ the translator passes to the model (:attr:`upsample_ratio`); a DAT can run in
        ``precision`` ``fp32`` (``None``), ``bf16`` or ``int8`` weights on the CPU
        (:func:`fadat.models.inference.with_precision`), with a vocabulary ``shortlist`` (``True``:
        the directory's ``shortlist.safetensors``, or a path) and with the token head pruned
        to vertices of passing probability ≥ ``prune_threshold`` (:func:`apply_reduced_head`).

        ``engine`` ``"auto"`` (the default) is ``"onnxruntime"`` for an export of ``fadat export
        --format onnx`` and ``"torch"`` for a model directory. With ``engine="onnxruntime"``
        ``directory`` is an export (or a DAT model directory, exported first), run by ONNX
        Runtime with ``intra_threads`` threads; ``precision`` is the export's (fp32 or int8),
        and the strategies are greedy, lookahead without n-gram bans, viterbi, joint-viterbi
        and, on an export of format version 2, beam (with a language model too:
        :func:`fadat.translation.language_model.language_model_options`)
        (:func:`fadat.translation.engines.load_translation_model`, docs/engine.md). An export
        made with a shortlist runs it; there ``shortlist`` checks that it is the export's
        (``True``: any), and a DAT model directory is exported with it.

        Raises:
            InputError: as :func:`fadat.translation.engines.load_translation_model`,
                :func:`apply_reduced_head` and :func:`check_upsample_ratio`.
        """
        if not isinstance(directory, str | Path):
            raise InputError(
                f"directory must be a path (str or pathlib.Path), got {type(directory).__name__}"
            )
        for name, value in (("device", device), ("precision", precision), ("engine", engine)):
            if value is None and name == "precision":
                continue
            if not isinstance(value, str | torch.device) or (
                name != "device" and not isinstance(value, str)
            ):
                raise InputError(f"{name} must be a string, got {type(value).__name__}")
        check_upsample_ratio(upsample_ratio)
        model, sp = load_translation_model(
            directory, engine, device, precision, intra_threads, shortlist=shortlist
        )
        model = apply_reduced_head(model, directory, shortlist, prune_threshold)
        return cls(model, sp, upsample_ratio)

    @property
    def model_type(self) -> str:
        """``"dat"`` or ``"at"``."""
        return self.model.model_type

    def translate(
        self,
        sentences: str | Sequence[str],
        strategy: str | None = None,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        **options: Any,
    ) -> str | list[str]:
        """Translate raw sentences; one detokenised string per sentence, in order.

        Args:
            sentences: one sentence (a ``str``: its translation is returned as a ``str``) or a
                sequence of sentences (a list of translations is returned).
            strategy: see :func:`strategy_options`; default lookahead (DAT) or beam (AT).
            max_tokens: per-batch budget (see :func:`translate_lines`).
            **options: the strategy's options, e.g. ``beta=1.0``, ``length_penalty=1.1``.

        Raises:
            InputError: ``sentences`` is neither a string nor a sequence of strings, or holds a
                lone surrogate; unknown strategy or option, invalid value.
            NonFiniteOutputError: (an InputError) the model's outputs for a sentence are NaN
                or infinite: its weights are corrupt (finite but extreme ones included).
        """
        lines, single = _sentences(sentences, "sentences")
        results = translate_lines(
            self.model,
            self.sp,
            lines,
            strategy=strategy,
            options=options,
            max_tokens=_max_tokens(max_tokens),
            upsample_ratio=self.upsample_ratio,
        )
        texts = [hyps[0].text for hyps in results]
        return texts[0] if single else texts

    def translate_nbest(
        self,
        sentences: str | Sequence[str],
        nbest: int,
        strategy: str | None = None,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        **options: Any,
    ) -> list[Translation] | list[list[Translation]]:
        """Up to ``nbest`` :class:`Translation` per sentence (DAT ``sample`` for ``nbest > 1``);
        for one sentence given as a ``str``, its list alone.

        Raises:
            InputError: as :meth:`translate`, or ``nbest`` is not an integer >= 1.
        """
        lines, single = _sentences(sentences, "sentences")
        results = translate_lines(
            self.model,
            self.sp,
            lines,
            strategy=strategy,
            options=options,
            nbest=nbest,
            max_tokens=_max_tokens(max_tokens),
            upsample_ratio=self.upsample_ratio,
        )
        return results[0] if single else results

    def score(
        self,
        sources: str | Sequence[str],
        targets: str | Sequence[str],
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
    ) -> PairScore | list[PairScore]:
        """``log P(y|x)`` of each pair (see :func:`score_pairs`); one :class:`PairScore` for a
        source and a target given as strings.

        Raises:
            InputError: a source or target that is not a string or holds a lone surrogate,
                one string against a sequence, or different numbers of sources and targets.
            NonFiniteOutputError: as :meth:`translate`.
        """
        src, single_src = _sentences(sources, "sources")
        tgt, single_tgt = _sentences(targets, "targets")
        if single_src != single_tgt:
            raise InputError("give sources and targets both as strings or both as sequences")
        scores = score_pairs(
            self.model,
            self.sp,
            src,
            tgt,
            max_tokens=_max_tokens(max_tokens),
            upsample_ratio=self.upsample_ratio,
        )
        return scores[0] if single_src else scores


def _sentences(value: Any, name: str) -> tuple[list[str], bool]:
    """``(lines, was_one_string)`` from a string or a sequence of strings.

    Raises:
        InputError: anything else (bytes, None, a number, a sequence holding a non-string), or
            a string holding a lone surrogate (:func:`fadat.data.text.check_unicode`).
    """
    if isinstance(value, str):
        check_unicode(value, name)
        return [value], True
    if isinstance(value, Mapping | Set):  # its keys, in no meaningful order: not sentences
        raise InputError(
            f"{name} must be a string or a sequence of strings, got {type(value).__name__}"
        )
    if isinstance(value, bytes | bytearray) or not isinstance(value, Iterable):
        raise InputError(
            f"{name} must be a string or a sequence of strings, got {type(value).__name__}"
        )
    lines = list(value)
    for i, item in enumerate(lines):
        if not isinstance(item, str):
            raise InputError(f"{name}[{i}] is a {type(item).__name__}, expected a string")
        check_unicode(item, f"{name}[{i}]")
    return lines, False


def _max_tokens(value: Any) -> int | None:
    """``max_tokens`` of the Python API: ``None`` or an integer >= 0 (0 = unlimited).

    Raises:
        InputError: another type or a negative value.
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InputError(f"max_tokens must be None or an integer >= 0, got {value!r}")
    return value
