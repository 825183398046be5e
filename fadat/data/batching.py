"""Token-budget batching: length-bucketed, shuffled per epoch, deterministic, shardable, resumable.

A sentence's cost is the larger of its source length, target length and graph size
``L = graph_size(source length, λ)`` (:func:`fadat.data.contract.graph_size`), since the decoder
runs on L vertices. A batch's cost is ``n_sentences × max cost`` (padded size). Sentences are
sorted by cost (ties broken by a seeded permutation) and cut greedily into global batches under
``max_tokens × world_size``; each epoch shuffles the order of the global batches with
``(seed, epoch)``, and rank ``r`` takes ``batch[r::world_size]`` of every global batch, so every
rank runs the same number of steps (a shard may be empty; the trainer handles that).
Resuming at ``(epoch, k)`` is ``batches(epoch)[k:]``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from fadat.data.contract import graph_size


def sentence_costs(
    source_lengths: Sequence[int] | np.ndarray,
    target_lengths: Sequence[int] | np.ndarray,
    upsample_ratio: float,
    max_graph_positions: int | None = None,
) -> np.ndarray:
    """``(N,)`` int64 cost per sentence: ``max(src, tgt, graph_size(src))``."""
    src = np.asarray(source_lengths, dtype=np.int64)
    tgt = np.asarray(target_lengths, dtype=np.int64)
    if src.shape != tgt.shape:
        raise ValueError(f"{len(src)} source lengths but {len(tgt)} target lengths")
    if len(src) == 0:
        return np.zeros(0, dtype=np.int64)
    graph = graph_size(src, upsample_ratio, max_graph_positions).numpy()  # (N,)
    return np.maximum(np.maximum(src, tgt), graph)


class TokenBatchSampler:
    """Batches of dataset indices under a token budget.

    Args:
        source_lengths, target_lengths: ``(N,)`` lengths including special tokens.
        max_tokens: budget per rank and step (padded tokens of the largest of source, target,
            graph).
        upsample_ratio: λ of the graph size.
        max_graph_positions: the decoder's maximum positions (graph sizes are clipped to it).
        seed: seeds the tie-breaking order and the per-epoch shuffle.
        shuffle: shuffle the batch order per epoch (else ascending cost).
        rank, world_size: this process's shard.

    Raises:
        ValueError: bad sizes, ``max_tokens < 1`` or ``rank`` outside ``[0, world_size)``.
    """

    def __init__(
        self,
        source_lengths: Sequence[int] | np.ndarray,
        target_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        upsample_ratio: float,
        max_graph_positions: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        self.costs = sentence_costs(
            source_lengths, target_lengths, upsample_ratio, max_graph_positions
        )
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self._global = self._make_global_batches(max_tokens * world_size)

    def _make_global_batches(self, budget: int) -> list[np.ndarray]:
        n = len(self.costs)
        if n == 0:
            return []
        # Sort by cost; equal costs in a seeded random order (so batches mix sentences).
        tie = np.random.default_rng([self.seed, 2**31 - 1]).permutation(n)
        order = tie[np.argsort(self.costs[tie], kind="stable")]  # (N,)
        costs = self.costs[order]  # (N,) ascending
        batches: list[np.ndarray] = []
        start = 0
        oversized = 0
        while start < n:
            # Ascending costs: a batch [start, end) costs (end - start) * costs[end - 1], which
            # grows with end; it holds at most budget // costs[start] sentences, so only that
            # window is searched (O(N) over the whole epoch).
            stop = min(n, start + budget // max(int(costs[start]), 1) + 1)
            ends = np.arange(start + 1, stop + 1)
            ok = (ends - start) * costs[ends - 1] <= budget
            k = int(np.argmin(ok)) if not ok.all() else len(ok)  # first failing position
            if k == 0:
                oversized += 1
                k = 1  # alone in its batch rather than dropped
            batches.append(order[start : start + k])
            start += k
        if oversized:
            warnings.warn(
                f"{oversized} sentence(s) exceed the budget of {budget} tokens alone; "
                "each gets its own batch",
                stacklevel=3,
            )
        return batches

    def num_batches(self, epoch: int = 0) -> int:
        """Number of steps per epoch (the same on every rank)."""
        return len(self._global)

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of ``epoch``, in step order."""
        order = np.arange(len(self._global))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self._global))
        return [self._global[i].tolist() for i in order]

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch`` (maybe empty lists); deterministic in (seed, epoch)."""
        return [b[self.rank :: self.world_size] for b in self.global_batches(epoch)]
