"""A lexical vocabulary shortlist for the DAT's token head (``fadat shortlist``,
:mod:`fadat.cli.shortlist`; from Python :func:`shortlist`).

The way Marian (``--shortlist``, a lexical table ``lex.s2t`` with the first ``N`` frequent words
and the ``k`` best translations of each source word) and CTranslate2 (``vmap.txt``, source
n-gram → target candidates, ``use_vmap``) shorten an AT's output layer, for a DAT: per sentence
the candidate target tokens are

- the special tokens ``<s>``, ``<pad>``, ``</s>``, ``<unk>``;
- the ``frequent`` most frequent target tokens of the training data;
- for every token of the source sentence, its ``top_k`` target tokens by ``P(t | s)``, the share
  of training pairs holding ``s`` in the source that also hold ``t`` in the target (sentence
  co-occurrence counts, counted once per pair), among the tokens that are not already frequent.

The table is built with NumPy from the binarized training split (``fadat prepare``'s
``train.{src,tgt}.ids.npy``) or from raw parallel text encoded with the model's sentencepiece
model, and stored in the model directory as ``shortlist.safetensors`` (``table`` ``(V, top_k)``
int32 padded with −1, ``frequent`` ``(N,)`` int32, and the settings as metadata; no pickle).

The decoders then take each vertex's best token and ``s_v`` over the sentence's shortlist:
the token head's log-softmax is renormalised over the shortlist (as Marian and CTranslate2 do),
so for a best token inside the shortlist ``s_v`` is ``log P(y|v) − log P(shortlist|v)``, never
below the full head's. In fp32, greedy and Viterbi (whose path does not read ``s``) then give
exactly the full head's outputs whenever the full head's path tokens are in the shortlist;
lookahead and joint-Viterbi weigh vertices by ``s`` and may move where the shortlist's mass
``P(shortlist|v)`` differs between vertices (tests/test_inference.py). Measured with the
defaults (20 + 100 frequent, built from bible-en-es's 28,380 training pairs: 337 candidates per
sentence on average) on the 50 test sentences of tests/data: every full-head path token covered;
outputs equal to the full head's for greedy 50/50, lookahead 44/50, joint-Viterbi 43/50;
``bench/bench_inference.py`` reports both rates (``cover``, ``=full``) with BLEU. In int8 the
shortlist's rows are multiplied in fp32 (dequantized weights), so even greedy may differ from
the int8 full head (2 of 50 sentences).

The table, the candidate rule and the file's reading are in :mod:`fadat.engine.shortlist`
(numpy only), which the ONNX Runtime engine shares: ``fadat export --format onnx --shortlist``
writes a graph whose token head runs over the candidates the engine computes by the same rule
(:mod:`fadat.translation.onnx_export`, docs/engine.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import fadat.engine.shortlist as engine_shortlist
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.engine.shortlist import SHORTLIST_NAME
from fadat.errors import InputError

SPECIAL_IDS = (BOS_ID, PAD_ID, EOS_ID, UNK_ID)
DEFAULT_TOP_K = 20
DEFAULT_FREQUENT = 100
# Pairs of co-occurrence keys counted at once (int64 keys: 64 MiB).
_CHUNK_KEYS = 1 << 23


@dataclass(frozen=True)
class Shortlist(engine_shortlist.Shortlist):
    """A lexical shortlist (see the module docstring): the table and candidate rule of
    :class:`fadat.engine.shortlist.Shortlist` (numpy only, what the ONNX Runtime engine reads),
    taking torch tensors too, and written with :meth:`save`.

    Attributes:
        table: ``(V, top_k)`` int64, each source token's candidate target tokens, best first,
            −1 where a token has fewer.
        frequent: ``(N,)`` int64, the always-included target tokens (specials first).
        metadata: how it was built (strings: ``top_k``, ``frequent``, ``pairs``, ``built_from``).
    """

    def candidates(self, source: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
        """The sorted target candidates of one source sentence
        (:meth:`fadat.engine.shortlist.Shortlist.candidates`).

        Args:
            source: the sentence's source ids (``x </s>``, padding allowed: ``<pad>`` and other
                specials add no candidates), on any device.

        Returns:
            ``(n,)`` int64, sorted, unique.
        """
        if isinstance(source, torch.Tensor):
            source = source.cpu().numpy()
        return super().candidates(source)

    def save(self, path: str | Path) -> Path:
        """Write ``shortlist.safetensors`` at ``path`` all-or-nothing; returns ``path``."""
        from fadat.outputs import atomic_write

        atomic_write(path, self.to_bytes())
        return Path(path)


def load_shortlist(path: str | Path, vocab_size: int | None = None) -> Shortlist:
    """Read a shortlist written by :meth:`Shortlist.save` (a model directory or the file;
    :func:`fadat.engine.shortlist.read_shortlist`).

    Raises:
        InputError: missing or unreadable file, wrong tensors, or a vocabulary size other than
            ``vocab_size`` (the message names the file).
    """
    try:
        return engine_shortlist.read_shortlist(path, vocab_size, Shortlist)
    except engine_shortlist.ShortlistError as err:
        raise InputError(str(err)) from err


def cooccurrence_counts(
    pairs: Iterable[tuple[np.ndarray, np.ndarray]], vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Sentence co-occurrence counts of (source token, target token), each pair counted once.

    Args:
        pairs: ``(source ids, target ids)`` per training pair; specials are ignored.
        vocab_size: ``V``.

    Returns:
        ``(keys, counts, source_counts, target_counts, n_pairs)``: ``keys`` ``(M,)`` int64
        ``s·V + t`` sorted with their ``counts`` ``(M,)``; ``source_counts``/``target_counts``
        ``(V,)`` int64 pairs holding each token; the number of pairs.
    """
    special = np.zeros(vocab_size, dtype=bool)
    special[list(SPECIAL_IDS)] = True
    src_count = np.zeros(vocab_size, dtype=np.int64)
    tgt_count = np.zeros(vocab_size, dtype=np.int64)
    merged_keys, merged_counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    pending: list[np.ndarray] = []
    size, n = 0, 0

    def flush() -> None:
        nonlocal merged_keys, merged_counts, pending, size
        if not pending:
            return
        keys, counts = np.unique(np.concatenate(pending), return_counts=True)
        both = np.concatenate([merged_keys, keys])
        merged_keys, inverse = np.unique(both, return_inverse=True)
        merged_counts = np.bincount(
            inverse, weights=np.concatenate([merged_counts, counts]), minlength=len(merged_keys)
        ).astype(np.int64)
        pending, size = [], 0

    for src, tgt in pairs:
        s = np.unique(np.asarray(src, dtype=np.int64))
        t = np.unique(np.asarray(tgt, dtype=np.int64))
        s, t = s[~special[s]], t[~special[t]]
        src_count[s] += 1
        tgt_count[t] += 1
        n += 1
        keys = (s[:, None] * vocab_size + t[None, :]).reshape(-1)  # (|s|·|t|,)
        pending.append(keys)
        size += len(keys)
        if size >= _CHUNK_KEYS:
            flush()
    flush()
    return merged_keys, merged_counts, src_count, tgt_count, n


def build_shortlist(
    pairs: Iterable[tuple[np.ndarray, np.ndarray]],
    vocab_size: int,
    top_k: int = DEFAULT_TOP_K,
    frequent: int = DEFAULT_FREQUENT,
    built_from: str = "",
) -> Shortlist:
    """Build the lexical table of the module docstring.

    Args:
        pairs: ``(source ids, target ids)`` per training pair.
        vocab_size: ``V``.
        top_k: candidates per source token (≥ 0), besides the frequent ones.
        frequent: the most frequent target tokens always included (≥ 0), besides the specials.
        built_from: a note stored in the metadata (the data it came from).

    Returns:
        The :class:`Shortlist`.

    Raises:
        InputError: negative ``top_k`` or ``frequent``.
    """
    if top_k < 0 or frequent < 0:
        raise InputError(f"top_k and frequent must be >= 0, got {top_k} and {frequent}")
    keys, counts, src_count, tgt_count, n = cooccurrence_counts(pairs, vocab_size)
    order = np.argsort(-tgt_count, kind="stable")
    top = order[:frequent][tgt_count[order[:frequent]] > 0]
    frequent_ids = np.concatenate([np.array(SPECIAL_IDS, dtype=np.int64), np.sort(top)])
    is_frequent = np.zeros(vocab_size, dtype=bool)
    is_frequent[frequent_ids] = True
    s, t = keys // vocab_size, keys % vocab_size  # (M,) each
    keep = ~is_frequent[t]
    s, t, c = s[keep], t[keep], counts[keep]
    # Within a source token, P(t|s) = c / count(s) ranks as c; ties by the target's frequency.
    rank = np.lexsort((-tgt_count[t], -c, s))  # by s, then count descending
    s, t = s[rank], t[rank]
    starts = np.searchsorted(s, np.arange(vocab_size))  # (V,) first entry of each source token
    within = np.arange(len(s)) - starts[s]  # (M',) rank within its source token
    sel = within < top_k
    table = np.full((vocab_size, top_k), -1, dtype=np.int64)
    table[s[sel], within[sel]] = t[sel]
    metadata = {
        "format": "fadat-lexical-shortlist-1",
        "top_k": str(top_k),
        "frequent": str(frequent),
        "pairs": str(n),
        "built_from": built_from,
    }
    return Shortlist(table, frequent_ids, metadata)


def write_ctranslate2_vmap(shortlist: Shortlist, pieces: Sequence[str], path: str | Path) -> Path:
    """The same shortlist as CTranslate2's vocabulary map (``vmap.txt``, ``use_vmap=True``):
    a line ``<TAB>frequent pieces`` (always candidates) and ``piece<TAB>its candidates`` per
    source token that has any; CTranslate2 then takes, per batch, the union over its source
    tokens (docs: CTranslate2 "Vocabulary mapping").

    Args:
        shortlist: built for the vocabulary ``pieces`` (id order).
        pieces: sentencepiece pieces in id order (no piece may hold a space or a tab).
        path: the file to write (inside a CTranslate2 model directory for ``use_vmap``).

    Raises:
        InputError: ``pieces`` has another size than the shortlist's vocabulary.
    """
    from fadat.outputs import atomic_write

    if len(pieces) != shortlist.vocab_size:
        raise InputError(
            f"{len(pieces)} pieces, the shortlist's vocabulary has {shortlist.vocab_size}"
        )
    lines = ["\t" + " ".join(pieces[t] for t in shortlist.frequent.tolist())]
    for s in range(shortlist.vocab_size):
        row = [pieces[t] for t in shortlist.table[s].tolist() if t >= 0]
        if row and int(s) not in SPECIAL_IDS:
            lines.append(pieces[s] + "\t" + " ".join(row))
    atomic_write(path, "\n".join(lines) + "\n")
    return Path(path)


# ----------------------------------------------------------------------------------------------
# Training pairs


def binarized_pairs(
    data_dir: str | Path, split: str = "train"
) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """``(source, target)`` id arrays of a prepared split (fadat.data.binarized)."""
    from fadat.data.binarized import BinarizedDataset

    data = BinarizedDataset(data_dir, split)
    for i in range(len(data)):
        yield data[i]


def text_pairs(
    sp, source_path: str | Path, target_path: str | Path
) -> Iterable[tuple[list[int], list[int]]]:
    """``(source, target)`` ids of raw parallel text files encoded with ``sp``.

    Raises:
        InputError: the files have different numbers of lines, or invalid UTF-8.
    """
    from fadat.data.spm import encode_source, encode_target
    from fadat.data.text import read_lines

    src, tgt = read_lines(str(source_path)), read_lines(str(target_path))
    if len(src) != len(tgt):
        raise InputError(f"{source_path}: {len(src)} lines but {target_path}: {len(tgt)} lines")
    for x, y in zip(src, tgt, strict=True):
        yield list(encode_source(sp, x)), list(encode_target(sp, y))


def coverage(
    shortlist: Shortlist, sources: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]
) -> dict:
    """How many of ``tokens`` (e.g. a decoder's path tokens per sentence) the sentences'
    shortlists hold: ``{"tokens": share of tokens, "sentences": share of sentences with all of
    their tokens, "size": mean shortlist size}``."""
    held = total = whole = 0
    sizes = []
    for src, toks in zip(sources, tokens, strict=True):
        cand = shortlist.candidates(src)
        sizes.append(len(cand))
        inside = np.isin(np.asarray(toks, dtype=np.int64), cand)
        held += int(inside.sum())
        total += len(inside)
        whole += bool(inside.all())
    n = max(len(sizes), 1)
    return {
        "tokens": held / max(total, 1),
        "sentences": whole / n,
        "size": float(np.mean(sizes)) if sizes else 0.0,
    }


# ----------------------------------------------------------------------------------------------
# Building and writing a model's shortlist (fadat shortlist)


def check_shortlist_output(
    model_dir: str | Path,
    output: str | Path | None = None,
    inputs: Iterable[tuple[str, str | Path | None]] = (),
    force: bool = False,
) -> Path:
    """Before any work: where :func:`shortlist` writes (:mod:`fadat.outputs`); returns it.

    Without ``output``, the model directory's own ``shortlist.safetensors``: a file of the
    model kind that this verb writes, replacing the one there. With ``output``, a file outside
    every input and every fadat dataset, model and run directory, which replaces an existing
    file only when fadat wrote it, or with ``force``.

    Args:
        model_dir: the model directory the shortlist is for.
        output: a shortlist file elsewhere, or ``None``.
        inputs: ``(flag, path)`` of the other files the shortlist is built from (``--data``,
            ``--source``, ``--target``); ``None`` paths are skipped.
        force: replace an existing ``output`` file that fadat did not write.

    Raises:
        InputError: a ``model_dir`` that is not a fadat model directory (default output); a
            ``shortlist.safetensors`` there that is not a regular file; an ``output`` refused
            by :func:`fadat.outputs.check_output_file`.
    """
    from fadat import outputs

    inputs = list(inputs)
    if output is not None:
        return outputs.check_output_file(
            output, "--output", [("--model", model_dir), *inputs], force
        )
    model = Path(model_dir)
    if outputs.output_kind(model) != "model":
        raise InputError(f"--model {model}: not a fadat model directory; give --output FILE")
    path = model / SHORTLIST_NAME
    if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
        raise InputError(f"{path}: exists and is not a regular file; fadat does not replace it")
    outputs.check_not_input(path, inputs, "the shortlist")
    outputs.remove_stale(path)
    return path


def shortlist(
    model_dir: str | Path,
    data_dir: str | Path | None = None,
    output: str | Path | None = None,
    *,
    split: str = "train",
    source: str | Path | None = None,
    target: str | Path | None = None,
    top_k: int = DEFAULT_TOP_K,
    frequent: int = DEFAULT_FREQUENT,
    force: bool = False,
) -> Path:
    """Build a model's lexical shortlist from its training data and write it (``fadat
    shortlist``): by default into the model directory as ``shortlist.safetensors``, where a
    DAT reads it (``fadat translate --shortlist``) and an AT's CTranslate2 export takes it as
    its vocabulary map (``fadat export --shortlist``).

    Args:
        model_dir: a DAT or AT model directory.
        data_dir: a prepared dataset (``fadat prepare``) with the model's vocabulary, whose
            ``split`` is counted; or ``None`` with ``source`` and ``target``.
        output: a shortlist file to write elsewhere (default: ``MODEL_DIR/shortlist.safetensors``).
        split: the split of ``data_dir`` to count.
        source: instead of ``data_dir``: raw source text (one sentence per line), encoded with
            the model's sentencepiece model.
        target: its raw target text, line by line.
        top_k: candidates per source token (>= 0; :func:`build_shortlist`).
        frequent: most frequent target tokens always included (>= 0).
        force: replace an existing ``output`` file that fadat did not write.

    Returns:
        The path written.

    Raises:
        InputError: neither ``data_dir`` nor ``source``/``target`` (or both), only one of
            ``source`` and ``target``, negative ``top_k`` or ``frequent``, not a DAT or AT model
            directory, one without a sentencepiece model (raw text), data with another
            vocabulary than the model's; an output refused by :func:`check_shortlist_output`.
    """
    from fadat import outputs
    from fadat.models.architectures import model_class
    from fadat.models.directory import read_model_metadata, spm_model_path

    if top_k < 0 or frequent < 0:
        raise InputError(f"top_k and frequent must be >= 0, got {top_k} and {frequent}")
    model = Path(model_dir)
    meta = read_model_metadata(model)
    cls = model_class(meta["model_type"])
    if not (cls.reduced_head or cls.autoregressive):
        raise InputError(
            f"{model}: holds a {meta['model_type']!r} model; shortlists are for DATs (fadat "
            "translate --shortlist) and ATs (fadat export --shortlist)"
        )
    vocab = int(meta["config"]["vocab_size"])
    if (data_dir is None) == (source is None and target is None):
        raise InputError("give either --data DIR or --source FILE --target FILE")
    inputs = [("--data", data_dir), ("--source", source), ("--target", target)]
    out = check_shortlist_output(model_dir, output, inputs, force)
    if data_dir is not None:
        from fadat.data.binarized import read_meta

        data_vocab = int(read_meta(data_dir)["vocab_size"])
        if data_vocab != vocab:
            raise InputError(f"{data_dir}: vocabulary of {data_vocab}, the model has {vocab}")
        pairs = binarized_pairs(data_dir, split)
        built_from = f"{Path(data_dir).resolve()} split {split}"
    else:
        if source is None or target is None:
            raise InputError("--source and --target go together")
        import sentencepiece as spm

        path = spm_model_path(model)
        if path is None:
            raise InputError(f"{model}: has no sentencepiece model to encode the text with")
        sp = spm.SentencePieceProcessor(model_file=str(path))
        pairs = text_pairs(sp, source, target)
        built_from = f"{Path(source).resolve()} / {Path(target).resolve()}"
    built = build_shortlist(pairs, vocab, top_k, frequent, built_from)
    if output is None:
        outputs.atomic_write(out, built.to_bytes(), "the shortlist")
        outputs.add_own_file(model, SHORTLIST_NAME)
    else:
        outputs.atomic_write(out, built.to_bytes(), "--output", record=True)
    return out
