"""The lexical vocabulary shortlist's table and its candidate rule, in numpy: what both engines
read. The torch engine reaches it through :mod:`fadat.models.shortlist` (which builds and
writes the table, ``fadat shortlist``); the ONNX Runtime engine
(:class:`fadat.engine.runtime.OnnxDAT`) reads the copy in an export made with ``fadat export
--format onnx --shortlist`` and feeds each batch's candidates to the graph.

A sentence's candidates are the table's ``frequent`` tokens (the special tokens first) and,
for each token of its source, that token's row of ``table`` (module docstring of
:mod:`fadat.models.shortlist`). The file is ``shortlist.safetensors``: ``table`` ``(V, top_k)``
int32 padded with −1, ``frequent`` ``(N,)`` int32 and the settings as string metadata.

Imports numpy and safetensors only (no torch, no other fadat package), like the rest of
:mod:`fadat.engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SHORTLIST_NAME = "shortlist.safetensors"
#: What pads a sentence's candidate ids to its batch's width in
#: :meth:`Shortlist.batch_candidates`: the graph of a shortlisted export gives such a column
#: a logit of −inf, so it changes no sentence's result.
PAD_CANDIDATE = -1


class ShortlistError(ValueError):
    """A shortlist file that cannot be used: missing, unreadable, holding other tensors, with
    ids outside its vocabulary, or built for another vocabulary size (the message names the
    file)."""


@dataclass(frozen=True)
class Shortlist:
    """A lexical shortlist (module docstring).

    Attributes:
        table: ``(V, top_k)`` int64, each source token's candidate target tokens, best first,
            −1 where a token has fewer.
        frequent: ``(N,)`` int64, the always-included target tokens (specials first).
        metadata: how it was built (strings: ``top_k``, ``frequent``, ``pairs``, ``built_from``).
    """

    table: np.ndarray
    frequent: np.ndarray
    metadata: dict[str, str]

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    def candidates(self, source: Sequence[int] | np.ndarray) -> np.ndarray:
        """The sorted target candidates of one source sentence: the one implementation of the
        rule, for both engines.

        Args:
            source: the sentence's source ids (``x </s>``, padding allowed: ``<pad>`` and other
                specials add no candidates, ids outside ``[0, V)`` are ignored).

        Returns:
            ``(n,)`` int64, sorted, unique.
        """
        ids = np.asarray(source, dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < self.vocab_size)]
        lexical = self.table[np.unique(ids)].reshape(-1)
        return np.union1d(self.frequent, lexical[lexical >= 0])

    def batch_candidates(self, source: np.ndarray, min_width: int = 1) -> np.ndarray:
        """The candidates of each sentence of a batch, one row each, as the graph of a
        shortlisted export takes them.

        Args:
            source: ``(B, S)`` integer source ids, right-padded with ``<pad>``.
            min_width: the fewest columns (the export's ``top_k``: its graph picks that many
                tokens per vertex).

        Returns:
            ``(B, K)`` int64, ``K = max(min_width, largest candidate count)``: row ``b`` is
            :meth:`candidates` of sentence ``b``, sorted, then :data:`PAD_CANDIDATE` up to
            ``K``.
        """
        rows = [self.candidates(row) for row in np.asarray(source)]
        width = max([min_width, *(len(r) for r in rows)])
        out = np.full((len(rows), width), PAD_CANDIDATE, dtype=np.int64)  # (B, K)
        for b, row in enumerate(rows):
            out[b, : len(row)] = row
        return out

    def same_table(self, other: Shortlist) -> bool:
        """Whether ``other`` gives every sentence the same candidates by the same table (equal
        ``table`` and ``frequent``; the metadata is not compared)."""
        return np.array_equal(self.table, other.table) and np.array_equal(
            self.frequent, other.frequent
        )

    def to_bytes(self) -> bytes:
        """The ``shortlist.safetensors`` file's content (int32 tensors, the metadata)."""
        from safetensors.numpy import save

        return save(
            {"table": self.table.astype(np.int32), "frequent": self.frequent.astype(np.int32)},
            metadata=self.metadata,
        )


def read_shortlist(
    path: str | Path, vocab_size: int | None = None, cls: type[Shortlist] = Shortlist
) -> Any:
    """Read a shortlist file (or the ``shortlist.safetensors`` of a directory) with numpy.

    Args:
        path: the file, or a directory holding :data:`SHORTLIST_NAME`.
        vocab_size: the vocabulary size it must be built for (``None``: any).
        cls: the class to return (:class:`Shortlist` or a subclass).

    Returns:
        A ``cls``: ``table`` ``(V, top_k)`` and ``frequent`` ``(N,)`` int64, the metadata.

    Raises:
        ShortlistError: missing or unreadable file, wrong tensors, ids outside the vocabulary
            or a vocabulary size other than ``vocab_size`` (the message names the file).
    """
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        path = path / SHORTLIST_NAME
    if not path.is_file():
        raise ShortlistError(f"{path}: no shortlist (create one with `fadat shortlist`)")
    try:
        with safe_open(str(path), framework="numpy") as f:
            keys = set(f.keys())
            if keys != {"table", "frequent"}:
                raise ShortlistError(
                    f"{path}: expected tensors 'table' and 'frequent', got {sorted(keys)}"
                )
            table = f.get_tensor("table").astype(np.int64)
            frequent = f.get_tensor("frequent").astype(np.int64)
            metadata = dict(f.metadata() or {})
    except ShortlistError:
        raise
    except Exception as err:  # safetensors raises its own error types for a corrupt file
        raise ShortlistError(f"{path}: unreadable shortlist ({err})") from err
    if table.ndim != 2 or frequent.ndim != 1:
        raise ShortlistError(f"{path}: table must be (V, k) and frequent (N,)")
    if vocab_size is not None and table.shape[0] != vocab_size:
        raise ShortlistError(
            f"{path}: built for a vocabulary of {table.shape[0]}, the model has {vocab_size}"
        )
    v = table.shape[0]
    if (
        table.max(initial=-1) >= v
        or table.min(initial=-1) < -1
        or frequent.max(initial=0) >= v
        or frequent.min(initial=0) < 0
    ):
        raise ShortlistError(f"{path}: token ids outside the vocabulary of {v}")
    return cls(table, frequent, metadata)
