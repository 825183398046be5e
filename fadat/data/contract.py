"""The data contract shared by every part of fadat: special ids, stored sequence layout, the batch
type and the graph size.

- Special ids (set through sentencepiece's training flags, fairseq's order): ``<s>`` = 0,
  ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3.
- A stored source sentence is ``x </s>``; a stored target sentence is ``<s> y </s>``
  (docs/reference-behaviour.md, "Graph size", [v2] layout). Lengths always count these special
  tokens.
- The graph size of a sentence is ``L = int(λ · |x </s>|)``, at least 2, clipped to the decoder's
  maximum positions (docs/reference-behaviour.md, "Graph size" ``source_old``). The batcher, the
  model and ``translate`` all call :func:`graph_size`; nothing else computes L. A model trained
  over a range of λ draws each training sentence's L with :func:`drawn_graph_size`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
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


#: The 64-bit constants of splitmix64 (Steele, Lea & Flood 2014; Vigna's reference code).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """One splitmix64 output per ``(N,)`` uint64 state (the finaliser of ``state + golden``);
    uint64 arithmetic wraps modulo 2**64 in numpy arrays, as the reference code's."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def uniform_draws(seed: int, update: int, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """One number in ``[0, 1)`` per sentence, a pure function of ``(seed, update, sentence id)``:
    splitmix64 chained over the three integers, the top 53 bits as a float64 fraction.

    No generator state is involved, so a resumed run draws the same numbers as an uninterrupted
    one from its saved update counter alone, and every rank (or batch order) gives a sentence the
    same number.

    Args:
        seed: the run's ``--seed`` (≥ 0).
        update: the 0-based index of the update the sentence is trained in (≥ 0).
        ids: ``(B,)`` the sentences' indices in their split (≥ 0).

    Returns:
        ``(B,)`` float64 in ``[0, 1)``.

    Raises:
        ValueError: a negative seed, update or id.
    """
    sid = np.asarray(torch.as_tensor(ids, dtype=torch.int64).cpu().numpy(), dtype=np.int64)
    if seed < 0 or update < 0 or (sid < 0).any():
        raise ValueError(f"seed, update and ids must be >= 0, got {seed}, {update}, {sid.min()}")
    state = _splitmix64(np.full(sid.shape, seed, dtype=np.uint64))
    state = _splitmix64(state ^ np.uint64(update))
    state = _splitmix64(state ^ sid.astype(np.uint64))
    return torch.from_numpy((state >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def drawn_graph_size(
    source_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    ratio_range: tuple[float, float],
    draws: torch.Tensor,
    max_positions: int | None = None,
) -> torch.Tensor:
    """Graph sizes of training sentences whose λ is drawn from a range (DA-Transformer v2's
    ``--upsample-scale a~b``: λ uniform in ``[a, b]`` per sentence).

    ``λ_b = a + u_b · (b − a)`` and ``L_b = int(λ_b · |x_b </s>|)`` as :func:`graph_size`, then
    raised to the target length ``T_b = |<s> y </s>|`` where it is smaller: a path of the DAG
    visits T_b distinct vertices, so ``L_b ≥ T_b`` is all the likelihood needs, and a drawn graph
    below it would make the sentence untrainable (v2 instead drops such pairs beforehand with
    ``--filter-ratio`` or loses them as invalid). Finally at least 2 and at most
    ``max_positions``: a target longer than the decoder's positions stays too long (the loss
    counts it as invalid, as with a fixed λ).

    Args:
        source_lengths: ``(B,)`` int64 source lengths including ``</s>``.
        target_lengths: ``(B,)`` int64 target lengths including ``<s>`` and ``</s>``.
        ratio_range: ``(a, b)``, ``0 < a ≤ b``.
        draws: ``(B,)`` float64 in ``[0, 1)`` (:func:`uniform_draws`).
        max_positions: the decoder's maximum number of positions.

    Returns:
        ``(B,)`` int64 on the device of ``source_lengths``.

    Raises:
        ValueError: a bad range, a source length < 1, mismatched shapes or ``max_positions`` < 2.
    """
    low, high = (float(r) for r in ratio_range)
    if not 0 < low <= high:
        raise ValueError(f"the λ range must satisfy 0 < a <= b, got {ratio_range}")
    if max_positions is not None and max_positions < 2:
        raise ValueError(f"max_positions must be >= 2, got {max_positions}")
    n = torch.as_tensor(source_lengths, dtype=torch.int64).cpu()
    t = torch.as_tensor(target_lengths, dtype=torch.int64).cpu()
    u = torch.as_tensor(draws, dtype=torch.float64).cpu()
    if not n.shape == t.shape == u.shape:
        raise ValueError(f"shapes differ: {tuple(n.shape)}, {tuple(t.shape)}, {tuple(u.shape)}")
    if (n < 1).any():
        raise ValueError("source lengths must be >= 1 (they include </s>)")
    ratios = low + u * (high - low)  # (B,) float64
    sizes = (n.to(torch.float64) * ratios).floor().to(torch.int64)  # (B,) as int(λ·n)
    sizes = torch.maximum(sizes, t).clamp(min=2)
    if max_positions is not None:
        sizes = sizes.clamp(max=max_positions)
    device = source_lengths.device if isinstance(source_lengths, torch.Tensor) else None
    return sizes.to(device) if device is not None else sizes


@dataclass(frozen=True)
class Batch:
    """One batch of parallel sentences, right-padded with ``PAD_ID``.

    Attributes:
        source: ``(B, S)`` int64, ``x </s>`` per row.
        target: ``(B, T)`` int64, ``<s> y </s>`` per row (may be ``None`` at inference).
        source_lengths: ``(B,)`` int64, including ``</s>``.
        target_lengths: ``(B,)`` int64, including ``<s>`` and ``</s>`` (``None`` at inference).
        ids: ``(B,)`` int64, the sentences' indices in their split (original order).
        graph_lengths: ``(B,)`` int64 graph sizes drawn for this training step
            (:func:`drawn_graph_size`, set by the trainer for a model trained over a λ range);
            ``None``: the model's own, from the source lengths and its fixed λ.
    """

    source: torch.Tensor
    target: torch.Tensor | None
    source_lengths: torch.Tensor
    target_lengths: torch.Tensor | None
    ids: torch.Tensor
    graph_lengths: torch.Tensor | None = None

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
            graph_lengths=move(self.graph_lengths),
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
