"""Binarized datasets: token ids and offsets per split, memory-mapped.

Layout of a prepared data directory ``DIR`` (written by ``fadat prepare``):

- ``meta.json``: languages, vocab size, special ids, counts, statistics, sources, licence;
- ``spm.model`` / ``spm.vocab``: the joint sentencepiece model;
- ``{split}.src.ids.npy`` / ``{split}.tgt.ids.npy``: all token ids of the split, concatenated
  (the smallest of ``uint8``, ``uint16``, ``int32`` that holds the vocabulary; datasets with
  another integer dtype are read too); sources are stored as ``x </s>``,
  targets as ``<s> y </s>``;
- ``{split}.src.off.npy`` / ``{split}.tgt.off.npy``: ``(N + 1,)`` int64 offsets, sentence ``i``
  is ``ids[off[i]:off[i + 1]]``;
- ``raw/{split}.src.txt``, ``raw/{split}.ref.txt``, ``raw/{split}.ref2.txt``…: the untouched text
  of the valid and test splits (scores are computed against it, never against decoded ids).

Only ``.npy`` files are read (``allow_pickle=False``).

A dataset's identity for training is the content of the files a training run reads
(:func:`training_digest`), not ``meta.json``'s ``"fingerprint"``: that is ``fadat prepare``'s
build cache key, which also hashes the code that builds the data
(:func:`fadat.data.build.fingerprint`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fadat.data.contract import Batch, make_batch
from fadat.data.text import read_lines
from fadat.errors import InputError

SIDES = ("src", "tgt")


def ids_dtype(vocab_size: int) -> np.dtype:
    """Smallest dtype that stores ids below ``vocab_size``: ``uint8``, ``uint16`` or ``int32``.

    Datasets written with another integer dtype (``int32`` for every vocabulary, before the
    streaming writer) are read the same way.
    """
    for dtype in (np.uint8, np.uint16):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int32)


class _GrowingNpy:
    """A 1-D ``.npy`` file written by appending: the header is written for shape ``(0,)`` and
    rewritten with the final length by :meth:`close` (numpy pads 1.0 headers so the length can
    grow in place)."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.length = 0
        self._file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._header = self._write_header(0)

    def _write_header(self, length: int) -> int:
        self._file.seek(0)
        np.lib.format.write_array_header_1_0(
            self._file,
            {
                "descr": np.lib.format.dtype_to_descr(self.dtype),
                "fortran_order": False,
                "shape": (length,),
            },
        )
        return self._file.tell()

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self._file.write(values.tobytes())
        self.length += len(values)

    def close(self) -> None:
        end = self._file.tell()
        if self._write_header(self.length) != self._header:
            raise RuntimeError(f"{self.path}: .npy header changed size")  # numpy format change
        self._file.seek(end)
        self._file.close()


class SplitWriter:
    """Writes one split's ids and offsets chunk by chunk, straight to the ``.npy`` files.

    Sources are stored as ``x </s>``, targets as ``<s> y </s>`` (the caller adds the specials).
    Call :meth:`close` after the last chunk; files of an unclosed writer have a wrong header
    (``fadat prepare`` writes into a temporary directory, so they are never seen).

    Args:
        directory: the dataset directory.
        split: ``"train"``, ``"valid"`` or ``"test"``.
        vocab_size: chooses the ids dtype (:func:`ids_dtype`).
    """

    def __init__(self, directory: str | Path, split: str, vocab_size: int) -> None:
        directory = Path(directory)
        dtype = self.dtype = ids_dtype(vocab_size)
        self._ids = {s: _GrowingNpy(directory / f"{split}.{s}.ids.npy", dtype) for s in SIDES}
        self._off = {s: _GrowingNpy(directory / f"{split}.{s}.off.npy", np.int64) for s in SIDES}
        for side in SIDES:
            self._off[side].append(np.zeros(1, dtype=np.int64))
        self.pairs = 0

    def append(
        self,
        source_ids: np.ndarray,
        source_lengths: np.ndarray,
        target_ids: np.ndarray,
        target_lengths: np.ndarray,
    ) -> None:
        """Append ``n`` pairs given as concatenated ids ``(Σ lengths,)`` and lengths ``(n,)``."""
        if len(source_lengths) != len(target_lengths):
            raise ValueError(f"{len(source_lengths)} sources but {len(target_lengths)} targets")
        for side, ids, lengths in (
            ("src", source_ids, source_lengths),
            ("tgt", target_ids, target_lengths),
        ):
            if int(np.sum(lengths)) != len(ids):
                raise ValueError(f"{side}: lengths sum to {int(np.sum(lengths))}, {len(ids)} ids")
            start = self._ids[side].length
            self._ids[side].append(ids)
            self._off[side].append(start + np.cumsum(lengths, dtype=np.int64))
        self.pairs += len(source_lengths)

    def close(self) -> None:
        for f in (*self._ids.values(), *self._off.values()):
            f.close()


def flatten(seqs: Sequence[Sequence[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(concatenated ids, lengths)`` of a list of id lists, as ``(Σ n_i,)`` ``dtype`` and
    ``(N,)`` int64."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(
        itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum())
    ).astype(dtype)
    return flat, lengths


def write_split(
    directory: str | Path,
    split: str,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    vocab_size: int,
) -> None:
    """Write one split's ids and offsets (``sources``: ``x </s>``, ``targets``: ``<s> y </s>``)."""
    writer = SplitWriter(directory, split, vocab_size)
    dtype = ids_dtype(vocab_size)
    writer.append(*flatten(sources, dtype), *flatten(targets, dtype))
    writer.close()


#: The progress file of ``fadat distill`` in its output dataset until the dataset is complete
#: (meta.json is written last).
DISTILL_PARTIAL = "distill.partial.jsonl"


def read_meta(data_dir: str | Path) -> dict:
    """``meta.json`` of a prepared directory.

    Raises:
        InputError: missing or unreadable meta.json; a dataset that ``fadat distill`` has not
            finished is named as such.
    """
    path = Path(data_dir) / "meta.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        if (Path(data_dir) / DISTILL_PARTIAL).is_file():
            raise InputError(
                f"{data_dir}: distillation unfinished (it holds {DISTILL_PARTIAL} but no "
                f"meta.json yet); run the same `fadat distill ... --output {data_dir}` again to "
                "finish it"
            ) from err
        raise InputError(f"{path}: not found (is {data_dir} a `fadat prepare` output?)") from err
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err})") from err


class BinarizedDataset:
    """One split of a prepared directory, memory-mapped.

    Opening reads only the offsets (the lengths come from them); token ids are read from the
    memory-mapped ``.ids.npy`` when a sentence is fetched, so opening costs ``O(N)`` for
    ``N`` sentences whatever the number of tokens, and each process touches only the pages of
    the sentences it fetches.

    Attributes:
        meta: the directory's meta.json.
        source_lengths: ``(N,)`` int64, source lengths including ``</s>``.
        target_lengths: ``(N,)`` int64, target lengths including ``<s>`` and ``</s>``.

    Raises (constructor):
        InputError: a file is missing or corrupted (offsets inconsistent with the data, ids
            that are not integers, counts that disagree with meta.json); the message names it.
            An id outside the vocabulary is reported when its sentence is fetched.
    """

    def __init__(self, data_dir: str | Path, split: str) -> None:
        self.data_dir = Path(data_dir)
        self.split = split
        self.meta = read_meta(self.data_dir)
        splits = self.meta.get("splits", {})
        if split not in splits:
            raise InputError(f"{self.data_dir}: no split {split!r} (have {sorted(splits)})")
        vocab = int(self.meta["vocab_size"])
        self.vocab_size = vocab
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
        lengths: dict[str, np.ndarray] = {}
        for side in SIDES:
            ids_path = self.data_dir / f"{split}.{side}.ids.npy"
            off_path = self.data_dir / f"{split}.{side}.off.npy"
            ids = _load(ids_path)
            off = _load(off_path)
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise InputError(f"{ids_path}: wrong shape or dtype ({ids.shape}, {ids.dtype})")
            if off.ndim != 1 or off.dtype != np.int64:
                raise InputError(f"{off_path}: wrong shape or dtype")
            if len(off) != int(splits[split]["pairs"]) + 1:
                raise InputError(
                    f"{off_path}: {len(off) - 1} sentences, meta.json says {splits[split]['pairs']}"
                )
            lengths[side] = np.diff(off)  # (N,) int64
            if off[0] != 0 or off[-1] != len(ids) or (lengths[side] < 1).any():
                raise InputError(f"{off_path}: offsets inconsistent with {ids_path.name}")
            self._ids[side] = ids
            self._off[side] = off
        self.source_lengths = lengths["src"]
        self.target_lengths = lengths["tgt"]

    def __len__(self) -> int:
        return len(self.source_lengths)

    def _get(self, side: str, i: int) -> np.ndarray:
        off = self._off[side]
        ids = np.asarray(self._ids[side][off[i] : off[i + 1]], dtype=np.int64)
        if ids.max() >= self.vocab_size or ids.min() < 0:
            bad = int(ids[(ids >= self.vocab_size) | (ids < 0)][0])
            raise InputError(
                f"{self.data_dir / f'{self.split}.{side}.ids.npy'}: token id {bad} of sentence "
                f"{i} outside the vocabulary ({self.vocab_size})"
            )
        return ids

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, target)`` int64 id arrays: ``x </s>`` and ``<s> y </s>``.

        Raises:
            IndexError: ``i`` out of range.
            InputError: an id outside the vocabulary (a corrupted file).
        """
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} sentences")
        i = i % n
        return self._get("src", i), self._get("tgt", i)

    def collate(self, indices: Sequence[int]) -> Batch:
        """A padded :class:`~fadat.data.contract.Batch` of these sentences (ids = indices)."""
        pairs = [self[int(i)] for i in indices]
        return make_batch([p[0] for p in pairs], [p[1] for p in pairs], [int(i) for i in indices])


def _load(path: Path) -> np.ndarray:
    if not path.is_file():
        raise InputError(f"{path}: missing (run `fadat prepare` again)")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: corrupted ({err})") from err


def _read_lines(path: Path) -> list[str]:
    """The lines of a raw text file of the dataset, read as every user text file is
    (:func:`fadat.data.text.read_lines`: strict UTF-8, no NUL byte, no CR-only line ends).

    Raises:
        InputError: missing, or a problem of :func:`~fadat.data.text.read_lines`, naming the
            file and line.
    """
    if not path.is_file():
        raise InputError(f"{path}: missing")
    return read_lines(path)


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


#: The files of the train split, in :func:`training_files`' order: a training run needs them all.
TRAIN_FILES = tuple(f"train.{side}.{kind}.npy" for side in SIDES for kind in ("ids", "off"))
#: The files of the valid split, in :func:`training_files`' order.
VALID_FILES = tuple(f"valid.{side}.{kind}.npy" for side in SIDES for kind in ("ids", "off"))
#: Bytes read at a time by :func:`training_digest`.
DIGEST_CHUNK = 1 << 20


def training_files(data_dir: str | Path) -> list[str]:
    """The files of the dataset ``data_dir`` that a training run reads, relative to it (``/``
    separated), in the order :func:`training_digest` hashes them:

    - ``spm.model``, where there is one (every ``fadat prepare`` output has one; the trainer
      reads it to check the vocabulary size and to detokenise validation outputs);
    - ``train.{src,tgt}.{ids,off}.npy``: required;
    - ``valid.{src,tgt}.{ids,off}.npy``, each where present (a dataset without a valid split
      trains without validation);
    - ``raw/valid.ref.txt``, ``raw/valid.ref2.txt``, …: the reference streams that validation
      scores against, as :func:`raw_references` finds them (``ref{k}`` while it exists).

    Not among them: ``meta.json`` (``fadat prepare``'s build cache key and statistics),
    ``raw/valid.src.txt`` (validation translates the binarized sources, never the raw text),
    ``spm.vocab``, the test split, ``.fadat-output.json`` and anything else in the directory.

    Raises:
        InputError: ``data_dir`` is not a directory, or a train file is missing (named).
    """
    root = Path(data_dir)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise InputError(f"data directory {data_dir} {what}")
    for name in TRAIN_FILES:
        if not (root / name).is_file():
            raise InputError(f"{root / name}: missing (run `fadat prepare` again)")
    names = ["spm.model"] if (root / "spm.model").is_file() else []
    names += [*TRAIN_FILES, *(n for n in VALID_FILES if (root / n).is_file())]
    k, ref = 1, "raw/valid.ref.txt"
    while (root / ref).is_file():
        names.append(ref)
        k += 1
        ref = f"raw/valid.ref{k}.txt"
    return names


def training_digest(data_dir: str | Path) -> str:
    """The identity of the dataset ``data_dir`` for training: the sha256 of the files a training
    run reads (:func:`training_files`, in that order), each preceded by its relative name and
    size (``"NAME\\nSIZE\\n"``), so that a file missing, renamed or changed in one byte gives
    another digest.

    Two directories holding the same content have the same digest, wherever and by whichever
    version of fadat they were prepared; ``meta.json`` is not hashed (its ``"fingerprint"`` is
    ``fadat prepare``'s build cache key, which changes with the code that builds the data).
    ``fadat train`` records it in checkpoint_last to recognise the run's dataset on resume
    (:func:`fadat.training.checkpoints.check_resume_data`).

    Cost: one sequential read of those files, in chunks of :data:`DIGEST_CHUNK` bytes, so that
    memory stays small whatever their size; its time is that of ``sha256sum`` on the same files
    (all of the train split: for a dataset of GBs, seconds to minutes where it is not cached).

    Returns:
        64 lowercase hex digits.

    Raises:
        InputError: as :func:`training_files`, or a file that cannot be read (named).
    """
    root = Path(data_dir)
    digest = hashlib.sha256()
    for name in training_files(root):
        path = root / name
        try:
            with open(path, "rb") as f:
                digest.update(f"{name}\n{os.fstat(f.fileno()).st_size}\n".encode())
                while chunk := f.read(DIGEST_CHUNK):
                    digest.update(chunk)
        except OSError as err:
            raise InputError(f"{path}: unreadable ({err})") from err
    return digest.hexdigest()
