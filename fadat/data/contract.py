"""The data contract shared by every part of fadat: special ids, stored sequence layout, the batch
type and the graph size.

- Special ids (set through sentencepiece's training flags, fairseq's order): ``<s>`` = 0,
  ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3.
- A stored source sentence is ``x </s>``; a stored target sentence is ``<s> y </s>``
  (docs/reference-behaviour.md, "Graph size", [v2] layout). Lengths always count these special
  tokens.
- The graph size of a sentence is ``L = int(λ · |x </s>|)``, at least 2, clipped to the decoder's
  maximum positions (docs/reference-behaviour.md, "Graph size" ``source_old``). The batcher, the
  model and ``translate`` all call :func:`graph_size`; nothing else computes L.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

BOS_ID = 0
PAD_ID = 1
EOS_ID = 2
UNK_ID = 3


def graph_size(
    source_lengths: torch.Tensor | Sequence[int] | int,
    upsample_ratio: float,
    max_positions: int | None = None,
) -> torch.Tensor:
    """Graph size L per sentence (docs/reference-behaviour.md, "Graph size", ``source_old``; paper
    §2.2 ``L = λ·N``).

    Args:
        source_lengths: ``(B,)`` int64 tensor, sequence of ints or one int: source lengths
            including ``</s>``.
        upsample_ratio: λ > 0.
        max_positions: the decoder's maximum number of positions; L is clipped to it.

    Returns:
        ``(B,)`` int64 tensor (a 0-d tensor for an int input): ``clip(int(λ·n), 2, max_positions)``.

    Raises:
        ValueError: λ ≤ 0, a source length < 1, or ``max_positions`` < 2.
    """
    if upsample_ratio <= 0:
        raise ValueError(f"upsample ratio λ must be > 0, got {upsample_ratio}")
    if max_positions is not None and max_positions < 2:
        raise ValueError(f"max_positions must be >= 2, got {max_positions}")
    n = torch.as_tensor(source_lengths, dtype=torch.int64)
    if (n < 1).any():
        raise ValueError("source lengths must be >= 1 (they include </s>)")
    # float64 product then truncation, as int(λ * n) in Python: 2.5 * 3 = 7.5 -> 7.
    sizes = (n.to(torch.float64) * float(upsample_ratio)).floor().to(torch.int64)
    sizes = sizes.clamp(min=2)
    if max_positions is not None:
        sizes = sizes.clamp(max=max_positions)
    return sizes


@dataclass(frozen=True)
class Batch:
    """One batch of parallel sentences, right-padded with ``PAD_ID``.

    Attributes:
        source: ``(B, S)`` int64, ``x </s>`` per row.
        target: ``(B, T)`` int64, ``<s> y </s>`` per row (may be ``None`` at inference).
        source_lengths: ``(B,)`` int64, including ``</s>``.
        target_lengths: ``(B,)`` int64, including ``<s>`` and ``</s>`` (``None`` at inference).
        ids: ``(B,)`` int64, the sentences' indices in their split (original order).
    """

    source: torch.Tensor
    target: torch.Tensor | None
    source_lengths: torch.Tensor
    target_lengths: torch.Tensor | None
    ids: torch.Tensor

    def __len__(self) -> int:
        return int(self.source.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        """Return the same batch on ``device`` (non-blocking copies)."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return Batch(
            source=move(self.source),
            target=move(self.target),
            source_lengths=move(self.source_lengths),
            target_lengths=move(self.target_lengths),
            ids=move(self.ids),
        )


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> torch.Tensor:
    """Right-pad lists of token ids into a ``(B, max_len)`` int64 tensor filled with ``pad_id``."""
    width = max((len(s) for s in sequences), default=0)
    out = torch.full((len(sequences), width), pad_id, dtype=torch.int64)
    for row, seq in enumerate(sequences):
        if len(seq):
            out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.int64)
    return out


def make_batch(
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]] | None,
    ids: Sequence[int],
) -> Batch:
    """Build a :class:`Batch` from stored id lists (``x </s>`` and ``<s> y </s>``)."""
    return Batch(
        source=pad_sequences(sources),
        target=None if targets is None else pad_sequences(targets),
        source_lengths=torch.as_tensor([len(s) for s in sources], dtype=torch.int64),
        target_lengths=None
        if targets is None
        else torch.as_tensor([len(t) for t in targets], dtype=torch.int64),
        ids=torch.as_tensor(list(ids), dtype=torch.int64),
    )
