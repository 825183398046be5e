"""Binarized datasets: token ids and offsets per split, memory-mapped.

Layout of a prepared data directory ``DIR`` (written by ``fadat prepare``):

- ``meta.json``: languages, vocab size, special ids, counts, statistics, sources, licence;
- ``spm.model`` / ``spm.vocab``: the joint sentencepiece model;
- ``{split}.src.ids.npy`` / ``{split}.tgt.ids.npy``: all token ids of the split, concatenated
  (``uint16`` when the vocabulary fits, else ``int32``); sources are stored as ``x </s>``,
  targets as ``<s> y </s>``;
- ``{split}.src.off.npy`` / ``{split}.tgt.off.npy``: ``(N + 1,)`` int64 offsets, sentence ``i``
  is ``ids[off[i]:off[i + 1]]``;
- ``raw/{split}.src.txt``, ``raw/{split}.ref.txt``, ``raw/{split}.ref2.txt``…: the untouched text
  of the valid and test splits (scores are computed against it, never against decoded ids).

Only ``.npy`` files are read (``allow_pickle=False``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fadat.data.contract import Batch, make_batch
from fadat.errors import InputError

SIDES = ("src", "tgt")


def ids_dtype(vocab_size: int) -> np.dtype:
    """Smallest dtype that stores ids below ``vocab_size``."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def write_split(
    directory: str | Path,
    split: str,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    vocab_size: int,
) -> None:
    """Write one split's ids and offsets (``sources``: ``x </s>``, ``targets``: ``<s> y </s>``)."""
    directory = Path(directory)
    dtype = ids_dtype(vocab_size)
    for side, seqs in zip(SIDES, (sources, targets), strict=True):
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(
            (t for s in seqs for t in s), dtype=np.int64, count=int(offsets[-1])
        ).astype(dtype)
        np.save(directory / f"{split}.{side}.ids.npy", flat, allow_pickle=False)
        np.save(directory / f"{split}.{side}.off.npy", offsets, allow_pickle=False)


def read_meta(data_dir: str | Path) -> dict:
    """``meta.json`` of a prepared directory.

    Raises:
        InputError: missing or unreadable meta.json.
    """
    path = Path(data_dir) / "meta.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise InputError(f"{path}: not found (is {data_dir} a `fadat prepare` output?)") from err
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err})") from err


class BinarizedDataset:
    """One split of a prepared directory, memory-mapped.

    Attributes:
        meta: the directory's meta.json.
        source_lengths: ``(N,)`` int64, source lengths including ``</s>``.
        target_lengths: ``(N,)`` int64, target lengths including ``<s>`` and ``</s>``.

    Raises (constructor):
        InputError: a file is missing or corrupted (offsets inconsistent with the data, ids
            outside the vocabulary, counts that disagree with meta.json); the message names it.
    """

    def __init__(self, data_dir: str | Path, split: str) -> None:
        self.data_dir = Path(data_dir)
        self.split = split
        self.meta = read_meta(self.data_dir)
        splits = self.meta.get("splits", {})
        if split not in splits:
            raise InputError(f"{self.data_dir}: no split {split!r} (have {sorted(splits)})")
        vocab = int(self.meta["vocab_size"])
        model = self.data_dir / "spm.model"
        if model.is_file():
            import sentencepiece

            pieces = sentencepiece.SentencePieceProcessor(model_file=str(model)).get_piece_size()
            if pieces != vocab:
                raise InputError(
                    f"{model}: {pieces} pieces but meta.json says vocab_size {vocab} "
                    "(mixed-up data directory?)"
                )
        self._ids: dict[str, np.ndarray] = {}
        self._off: dict[str, np.ndarray] = {}
        for side in SIDES:
            ids_path = self.data_dir / f"{split}.{side}.ids.npy"
            off_path = self.data_dir / f"{split}.{side}.off.npy"
            ids = _load(ids_path, mmap=True)
            off = _load(off_path, mmap=False)
            if ids.ndim != 1 or off.ndim != 1 or off.dtype != np.int64:
                raise InputError(f"{off_path}: wrong shape or dtype")
            if len(off) != int(splits[split]["pairs"]) + 1:
                raise InputError(
                    f"{off_path}: {len(off) - 1} sentences, meta.json says {splits[split]['pairs']}"
                )
            if off[0] != 0 or off[-1] != len(ids) or (np.diff(off) < 1).any():
                raise InputError(f"{off_path}: offsets inconsistent with {ids_path.name}")
            if len(ids) and int(ids.max()) >= vocab:
                raise InputError(
                    f"{ids_path}: token id {int(ids.max())} outside the vocabulary ({vocab})"
                )
            self._ids[side] = ids
            self._off[side] = off
        self.source_lengths = np.diff(self._off["src"]).astype(np.int64)
        self.target_lengths = np.diff(self._off["tgt"]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.source_lengths)

    def _get(self, side: str, i: int) -> np.ndarray:
        off = self._off[side]
        return np.asarray(self._ids[side][off[i] : off[i + 1]], dtype=np.int64)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, target)`` int64 id arrays: ``x </s>`` and ``<s> y </s>``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} sentences")
        i = i % n
        return self._get("src", i), self._get("tgt", i)

    def collate(self, indices: Sequence[int]) -> Batch:
        """A padded :class:`~fadat.data.contract.Batch` of these sentences (ids = indices)."""
        pairs = [self[int(i)] for i in indices]
        return make_batch([p[0] for p in pairs], [p[1] for p in pairs], [int(i) for i in indices])


def _load(path: Path, mmap: bool) -> np.ndarray:
    if not path.is_file():
        raise InputError(f"{path}: missing (run `fadat prepare` again)")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: corrupted ({err})") from err


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise InputError(f"{path}: missing")
    text = path.read_text(encoding="utf-8")
    return text.split("\n")[:-1] if text else []


def raw_sources(data_dir: str | Path, split: str) -> list[str]:
    """The untouched source lines of a valid/test split."""
    return _read_lines(Path(data_dir) / "raw" / f"{split}.src.txt")


def raw_references(data_dir: str | Path, split: str) -> list[list[str]]:
    """Reference streams ``[ref, ref2, …]``, each a list of lines (sacrebleu's layout)."""
    raw = Path(data_dir) / "raw"
    streams = [_read_lines(raw / f"{split}.ref.txt")]
    k = 2
    while (raw / f"{split}.ref{k}.txt").is_file():
        streams.append(_read_lines(raw / f"{split}.ref{k}.txt"))
        k += 1
    if any(len(s) != len(streams[0]) for s in streams):
        raise InputError(f"{raw}: reference files of {split} differ in line count")
    return streams
