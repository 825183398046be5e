"""SentencePiece models with fadat's special ids (<s>=0, <pad>=1, </s>=2, <unk>=3).

The ids are set through sentencepiece's training flags, and checked again whenever a model is
trained or loaded, so a model trained elsewhere with other ids is refused with an InputError.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.errors import InputError

SPECIALS = {"<s>": BOS_ID, "<pad>": PAD_ID, "</s>": EOS_ID, "<unk>": UNK_ID}


def train_sentencepiece(
    sentences: Iterable[str | Path],
    model_prefix: str | Path,
    vocab_size: int = 8000,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    num_threads: int = 2,
) -> spm.SentencePieceProcessor:
    """Train a (joint) sentencepiece model on ``sentences``; writes ``<prefix>.model`` / ``.vocab``.

    Every given line is used, in order (``input_sentence_size=0``): the lines are streamed into
    the trainer, which holds them in memory, so a caller with a large corpus passes a sample
    (``fadat prepare`` draws a seeded one, ``--spm-sample-pairs``).

    Over 80 lines with this docstring (about 55 of code), kept whole: the line stream, the
    state it records (lines fed, an exception raised inside it) and the handling of the
    trainer's RuntimeError, which reads that state to tell the caller's error from
    sentencepiece's, are one mechanism.

    Args:
        sentences: training lines (for a joint model: source and target lines together); a
            :class:`~pathlib.Path` item stands for all lines of that UTF-8 file. Blank lines
            are skipped.
        model_prefix: output path without extension.
        vocab_size: total vocabulary size, including the 4 special pieces.
        model_type: ``"bpe"``, ``"unigram"``, ``"char"`` or ``"word"``.
        character_coverage: 1.0 keeps every character (no ``<unk>`` on the training text).
        num_threads: sentencepiece trainer threads.

    Returns:
        The loaded model.

    Raises:
        InputError: no training text, or a vocabulary too large for the text; an exception
            raised while ``sentences`` is iterated (an InputError from a file, a
            KeyboardInterrupt) is passed on unchanged.
    """
    fed = {"lines": 0, "error": None}

    def stream() -> Iterator[str]:
        try:
            for item in sentences:
                lines = (
                    item.read_text(encoding="utf-8").splitlines()
                    if isinstance(item, Path)
                    else [item]
                )
                for line in lines:
                    if line.strip():
                        fed["lines"] += 1
                        yield line
        except BaseException as err:  # InputError, KeyboardInterrupt (Ctrl-C, SIGTERM), ...
            fed["error"] = err  # sentencepiece wraps it in a RuntimeError; re-raised below
            raise

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=stream(),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            bos_id=BOS_ID,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_piece="<s>",
            pad_piece="<pad>",
            eos_piece="</s>",
            unk_piece="<unk>",
            # Deterministic: use every given sentence, in order (sentencepiece's own sampling,
            # shuffle_input_sentence, differs from process to process even with a fixed seed).
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as err:
        if fed["error"] is not None:
            raise fed["error"] from None
        if not fed["lines"]:
            raise InputError("cannot train sentencepiece: no training text") from None
        raise InputError(_training_failure(str(err), vocab_size)) from err
    if fed["error"] is not None:
        raise fed["error"]
    prefix = Path(model_prefix)
    prefix.with_name(prefix.name + ".model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    check_special_ids(sp, f"{prefix}.model")
    with open(prefix.with_name(prefix.name + ".vocab"), "w", encoding="utf-8") as f:
        for i in range(sp.get_piece_size()):
            f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n")
    return sp


def _training_failure(message: str, vocab_size: int) -> str:
    """Our message for sentencepiece's training error ``message``: which way ``--vocab-size``
    must move, with the bound sentencepiece computed."""
    last = message.strip().splitlines()[-1] if message.strip() else message
    small = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", last)
    if small:
        return (
            f"--vocab-size {vocab_size} is too small: the text has more distinct characters "
            f"than that (with the special pieces, {small.group(2)} pieces are needed); give "
            f"--vocab-size {small.group(2)} or more"
        )
    high = re.search(r"[Vv]ocabulary size too high.*?<=\s*(\d+)", last)
    if high:
        return (
            f"--vocab-size {vocab_size} is too large for this text (sentencepiece finds at most "
            f"{high.group(1)} pieces); give --vocab-size {high.group(1)} or less"
        )
    return f"sentencepiece training failed ({last}); check --vocab-size and --model-type"


def check_special_ids(sp: spm.SentencePieceProcessor, name: str) -> None:
    """Raise InputError when the model's special ids differ from fadat's contract."""
    got = {
        "<s>": sp.bos_id(),
        "<pad>": sp.pad_id(),
        "</s>": sp.eos_id(),
        "<unk>": sp.unk_id(),
    }
    if got != SPECIALS:
        raise InputError(
            f"{name}: sentencepiece special ids {got} differ from fadat's {SPECIALS} "
            "(train with bos_id=0 pad_id=1 eos_id=2 unk_id=3)"
        )


def load_sentencepiece(path: str | Path) -> spm.SentencePieceProcessor:
    """Load a sentencepiece model and check its special ids.

    Raises:
        InputError: missing or unreadable file, or special ids that differ from the contract.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: sentencepiece model not found")
    sp = spm.SentencePieceProcessor()
    try:
        sp.load(str(path))
    except (OSError, RuntimeError) as err:
        raise InputError(f"{path}: not a sentencepiece model ({err})") from err
    check_special_ids(sp, str(path))
    return sp


def encode_source(sp: spm.SentencePieceProcessor, text: str) -> list[int]:
    """Stored source ids: ``x </s>``."""
    return list(sp.encode(text, out_type=int)) + [EOS_ID]


def encode_target(sp: spm.SentencePieceProcessor, text: str) -> list[int]:
    """Stored target ids: ``<s> y </s>``."""
    return [BOS_ID] + list(sp.encode(text, out_type=int)) + [EOS_ID]


def encode_many(
    sp: spm.SentencePieceProcessor, texts: Sequence[str], num_threads: int = 2
) -> list[list[int]]:
    """Plain piece ids of many lines (no specials), encoded by ``num_threads`` sentencepiece
    threads."""
    return sp.encode(list(texts), out_type=int, num_threads=num_threads)


def decode(sp: spm.SentencePieceProcessor, ids: Sequence[int]) -> str:
    """Detokenized text of ``ids``; <s>, <pad> and </s> are dropped (decoding stops at nothing)."""
    keep = [int(i) for i in ids if int(i) not in (BOS_ID, PAD_ID, EOS_ID)]
    return sp.decode(keep)
