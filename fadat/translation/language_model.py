"""The n-gram language model of the DAG beam search (strategy ``beam``; thu-coai/DAG-Search's
``--decode-lm-path``, docs/reference-behaviour.md): an n-gram model opened once
(:func:`open_language_model`), the LM word of each of a model's token ids (:func:`lm_words`: its
sentencepiece pieces), the check that the LM speaks those pieces (:func:`piece_coverage`), and
the decoder keywords ``lm`` / ``lm_words`` that ``fadat translate``, ``fadat evaluate`` and
``fadat serve`` give the beam search (:func:`language_model_options`). The text an LM is trained
on is written with :func:`lm_sentence` (``scripts/lm_corpus.py``).

The LM reads an output as the model's pieces separated by spaces (``▁En ▁el ▁princip io``),
the way :func:`fadat.decoding.beam.beam_search` feeds it one token id at a time: it must be
trained on text written so (docs/guides/translate.md). The reference does the same with its
fairseq dictionary's symbols (the BPE units the model was trained on).

Special ids: only those that an intermediate vertex of the graph emits reach the LM; ``<pad>``
never does (the beam search drops it from the output, :mod:`fadat.decoding.beam`), ``<s>``,
``</s>`` and ``<unk>`` can. All four are given to the LM as ``<unk>``, the LM's unknown word: a
stray ``<s>`` or ``</s>`` in the middle of an output is text the LM never saw. The reference
passes ``<s>`` and ``</s>`` as themselves, which a KenLM model reads as sentence boundaries; an
LM of ``lmplz`` gives ``<s>`` the probability 1 (log10 0), so a γ > 0 would reward such a token.

An ARPA file is read by :class:`fadat.engine.ngram.NgramModel` (its n-grams looked up inside
the compiled search); a KenLM binary file needs the optional ``kenlm`` package
(``pip install -e ".[lm]"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fadat.engine.beam_np as beam_np
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.errors import DecodingOptionError, InputError

if TYPE_CHECKING:
    from torch import nn

#: The LM word of the special ids (see the module docstring;
#: :data:`fadat.engine.beam_np.SPECIAL_WORD`, where the torch-free engine finds it).
SPECIAL_WORD = beam_np.SPECIAL_WORD

#: An LM is refused when fewer than this share of the model's ordinary pieces (every piece but
#: the four special ones) are words of its vocabulary: it was trained on other text than the
#: model's pieces (words, another tokenizer) and would score (almost) every output token as
#: ``<unk>``. Measured on the released Bible model's joint English-Spanish vocabulary (3,996
#: ordinary pieces): an LM of its training targets as pieces (``scripts/lm_corpus.py``) holds
#: 2,482 of them (62 %: the Spanish ones), an LM of the same text as words 90 (2 %: pieces
#: inside words that are also words, ``de``, ``que``, ``los``).
MIN_PIECE_COVERAGE = 0.1

#: The decoding options that weigh the language model (:data:`fadat.options.DECODING_OPTIONS`):
#: read only with one, so the beam search's record refuses them without it; the verbs offer
#: their flags beside ``--lm``, and ``fadat serve`` takes them in requests only when it has an LM.
WEIGHT_OPTIONS = ("gamma",)

_SPECIAL_IDS = (BOS_ID, PAD_ID, EOS_ID, UNK_ID)


def lm_words(sp: Any) -> list[str]:
    """The LM word of every token id of a sentencepiece model: its piece (``▁el``), and
    :data:`SPECIAL_WORD` for ``<s>``, ``<pad>``, ``</s>`` and ``<unk>``.

    Args:
        sp: a ``sentencepiece.SentencePieceProcessor`` with fadat's special ids.

    Returns:
        ``sp.get_piece_size()`` strings, indexed by token id (the beam search's ``lm_words``).

    The rule is :func:`fadat.engine.beam_np.lm_words` (importable without torch, for the ONNX
    Runtime engine) with fadat's special ids.
    """
    return beam_np.lm_words(sp, _SPECIAL_IDS)


def lm_sentence(sp: Any, ids: Iterable[int]) -> str:
    """One line of an LM's training text: the pieces of ``ids`` separated by single spaces, the
    special ids left out (``<s>`` and ``</s>`` are the LM's own sentence boundaries; ``lmplz``
    refuses ``<unk>`` in its text).

    Args:
        sp: the sentencepiece model of the ids.
        ids: token ids, e.g. a stored target ``<s> y </s>``.
    """
    return " ".join(sp.id_to_piece(int(i)) for i in ids if int(i) not in _SPECIAL_IDS)


def open_language_model(path: str | Path, cli: bool = False) -> Any:
    """Open a language model file once: an ARPA file (text or gzip) as an
    :class:`~fadat.engine.ngram.NgramModel`, a KenLM binary (``build_binary`` output) with
    ``kenlm``, quietly: the engine's opener (:func:`fadat.engine.beam_np.open_model`), whose
    refusals become :class:`~fadat.errors.InputError`.

    Args:
        path: the file.
        cli: name the option ``--lm`` in messages rather than the keyword ``lm``.

    Returns:
        An ``NgramModel`` or a ``kenlm.Model``.

    Raises:
        InputError: the file does not exist, is a directory or cannot be read; it is not an
            ARPA file (naming the line and the problem); a KenLM binary without the ``kenlm``
            package, or one KenLM cannot read (naming the file and KenLM's reason).
    """
    try:
        return beam_np.open_model(Path(path), "--lm" if cli else "lm")
    except beam_np.LanguageModelError as err:
        raise InputError(str(err)) from None


def piece_coverage(lm: Any, words: Sequence[str]) -> tuple[int, int]:
    """How many of a model's ordinary pieces are words of the LM's vocabulary.

    Args:
        lm: an ``NgramModel`` or a ``kenlm.Model`` (anything with ``in``).
        words: :func:`lm_words` of the model's sentencepiece model.

    Returns:
        ``(pieces in the LM's vocabulary, ordinary pieces)``; the special ids are not counted.
    """
    ordinary = [w for i, w in enumerate(words) if i not in _SPECIAL_IDS]
    return sum(w in lm for w in ordinary), len(ordinary)


def check_takes_language_model(
    model: nn.Module,
    strategies: Sequence[str],
    cli: bool = False,
    strategy_flag: str = "--strategy",
) -> None:
    """Refuse a language model for a model or strategies that cannot use one, before it is
    opened.

    Args:
        model: the translation model.
        strategies: the strategies it will decode with.
        cli: name the options ``--lm`` and ``strategy_flag`` rather than the keywords.
        strategy_flag: the flag that chose ``strategies``.

    Raises:
        DecodingOptionError: none of ``strategies`` (that ``model`` offers) takes ``lm``: not
            the DAG beam search, or a model without it (AT, NAT, CTC).
    """
    offered = model.strategies()
    if any("lm" in offered.get(s, ()) for s in strategies):
        return
    name = "--lm" if cli else "lm"
    kind = model.model_type.upper()
    takers = [s for s, names in offered.items() if "lm" in names]
    if not takers:
        raise DecodingOptionError(
            f"{name}: a language model is for the beam search of DAT models; no strategy of "
            f"this {kind} model takes one"
        )
    chosen = ", ".join(repr(s) for s in strategies)
    which = f"strategy {chosen} takes" if len(strategies) == 1 else f"strategies {chosen} take"
    how = f"{strategy_flag} {takers[0]}" if cli else f"strategy={takers[0]!r}"
    raise DecodingOptionError(
        f"{name}: {which} no language model; {' and '.join(takers)} does ({how})"
    )


def language_model_options(
    lm: Any, model: nn.Module, sp: Any, path: str | Path | None = None, cli: bool = False
) -> dict[str, Any]:
    """The beam search's keywords for a language model and a translation model:
    ``{"lm": model, "lm_words": lm_words(sp)}``, to merge into the strategy's options
    (``fadat translate --lm``; ``Translator.translate(..., strategy="beam", **options)``).

    Args:
        lm: an opened model (:func:`open_language_model`'s), or the path of a file (opened
            here; a caller that decodes many times opens it once and passes the model).
        model: the translation model (only its vocabulary size is read).
        sp: its sentencepiece model.
        path: the LM's file, for messages (default: ``lm`` when it is a path).
        cli: name the option ``--lm`` rather than the keyword ``lm``.

    Raises:
        InputError: as :func:`open_language_model`; fewer than :data:`MIN_PIECE_COVERAGE` of
            the model's pieces are in the LM's vocabulary (an LM of words, or of another
            tokenizer's units); ``sp`` is not the model's (another vocabulary size).
    """
    if isinstance(lm, str | Path):
        path = lm if path is None else path
        lm = open_language_model(lm, cli)
    words = lm_words(sp)
    known, total = piece_coverage(lm, words)
    if total and known < MIN_PIECE_COVERAGE * total:
        where = path if path is not None else "the language model"
        name = "--lm" if cli else "lm"
        raise InputError(
            f"{where}: only {known} of the model's {total} sentencepiece pieces are words of "
            f"this language model ({name}; at least {MIN_PIECE_COVERAGE:.0%} needed): it looks "
            "trained on words, not on the model's pieces; write its training text with "
            "scripts/lm_corpus.py (docs/guides/translate.md)"
        )
    if len(words) != model.config.vocab_size:  # a Python caller's pair; the loaders check it
        raise InputError(
            f"the sentencepiece model has {len(words)} pieces, the model "
            f"{model.config.vocab_size} tokens"
        )
    return {"lm": lm, "lm_words": words}
