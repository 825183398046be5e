"""SentencePiece models with fadat's special ids (<s>=0, <pad>=1, </s>=2, <unk>=3).

The ids are set through sentencepiece's training flags, and checked again whenever a model is
trained or loaded, so a model trained elsewhere with other ids is refused with an InputError.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
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
) -> spm.SentencePieceProcessor:
    """Train a (joint) sentencepiece model on ``sentences``; writes ``<prefix>.model`` / ``.vocab``.

    Args:
        sentences: training lines (for a joint model: source and target lines together); a
            :class:`~pathlib.Path` item stands for all lines of that UTF-8 file.
        model_prefix: output path without extension.
        vocab_size: total vocabulary size, including the 4 special pieces.
        model_type: ``"bpe"``, ``"unigram"``, ``"char"`` or ``"word"``.
        character_coverage: 1.0 keeps every character (no ``<unk>`` on the training text).

    Returns:
        The loaded model.

    Raises:
        InputError: no training text, or a vocabulary too large for the text.
    """
    lines: list[str] = []
    for item in sentences:
        if isinstance(item, Path):
            lines.extend(item.read_text(encoding="utf-8").splitlines())
        else:
            lines.append(item)
    lines = [s for s in lines if s.strip()]
    if not lines:
        raise InputError("cannot train sentencepiece: no training text")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
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
            # Deterministic: use every sentence, in order.
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=2,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise InputError(
            f"sentencepiece training failed ({str(err).strip().splitlines()[-1]}); "
            "a smaller --vocab-size may help"
        ) from err
    prefix = Path(model_prefix)
    prefix.with_name(prefix.name + ".model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    check_special_ids(sp, f"{prefix}.model")
    with open(prefix.with_name(prefix.name + ".vocab"), "w", encoding="utf-8") as f:
        for i in range(sp.get_piece_size()):
            f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n")
    return sp


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


def encode_many(sp: spm.SentencePieceProcessor, texts: Sequence[str]) -> list[list[int]]:
    """Plain piece ids of many lines (no specials), batched for speed."""
    return [list(x) for x in sp.encode(list(texts), out_type=int, num_threads=2)]


def decode(sp: spm.SentencePieceProcessor, ids: Sequence[int]) -> str:
    """Detokenized text of ``ids``; <s>, <pad> and </s> are dropped (decoding stops at nothing)."""
    keep = [int(i) for i in ids if int(i) not in (BOS_ID, PAD_ID, EOS_ID)]
    return sp.decode(keep)
