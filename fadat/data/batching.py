"""Token-budget batching: length-bucketed, shuffled per epoch, deterministic, shardable, resumable.

A sentence's cost is the larger of its source length, target length and graph size
``L = graph_size(source length, λ)`` (:func:`fadat.data.contract.graph_size`), since the decoder
runs on L vertices. A batch's cost is ``n_sentences × max cost`` (padded size). Sentences are
sorted by cost (ties broken by a seeded permutation) and cut greedily into global batches under
``max_tokens × world_size``; each epoch shuffles the order of the global batches with
``(seed, epoch)``, and rank ``r`` takes ``batch[r::world_size]`` of every global batch, so every
rank runs the same number of steps (a shard may be empty; the trainer handles that).
Resuming at ``(epoch, k)`` is ``batches(epoch)[k:]``, made lazily by :meth:`TokenBatchSampler.shard`
without the first ``k`` batches. The plan takes ``O(N)`` memory (index views into one sorted
order), never the token ids.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

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


def greedy_batch_ends(costs: Sequence[int] | np.ndarray, budget: int) -> list[int]:
    """Cut ascending ``costs`` ``(N,)`` greedily into batches ``[start, end)`` of padded cost
    ``(end - start) * costs[end - 1] <= budget``: returns the ends, one per batch (a sentence
    whose cost alone exceeds the budget gets a batch of its own).

    Works on runs of equal cost instead of sentence by sentence: a batch that starts at ``i``
    ends in the run of some cost ``v >= costs[i]``, at ``min(run end, i + budget // v)``; the
    runs are tried in ascending order until the budget stops the batch (``(e - i) *
    costs[e - 1]`` grows with ``e``, so the first run that cannot be entered ends the search).
    ``O(N)`` array work plus a few Python steps per batch.
    """
    costs = np.asarray(costs)
    n = len(costs)
    if n == 0:
        return []
    values, first = np.unique(costs, return_index=True)
    values, first = values.tolist(), [*first.tolist(), n]  # run k is [first[k], first[k + 1])
    ends = []
    start, run = 0, 0
    while start < n:
        while first[run + 1] <= start:
            run += 1
        end = start + 1  # alone, if even that is over the budget
        for k in range(run, len(values)):
            reach = start + budget // values[k]  # the furthest end at this cost
            if reach < max(first[k], start) + 1:
                break
            end = min(first[k + 1], reach)
            if end < first[k + 1]:
                break
        ends.append(end)
        start = end
    return ends


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
        key = self.costs[tie]
        if len(key) and key.max() <= np.iinfo(np.uint16).max:
            key = key.astype(np.uint16)  # a radix sort; the same stable order
        order = tie[np.argsort(key, kind="stable")]  # (N,)
        batches: list[np.ndarray] = []
        start = 0
        oversized = 0
        for end in greedy_batch_ends(self.costs[order], budget):
            oversized += end == start + 1 and self.costs[order[start]] > budget
            batches.append(order[start:end])  # a view: no copy of the indices
            start = end
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

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch`` (maybe empty lists); deterministic in (seed, epoch)."""
        return [b.tolist() for b in self.shard(epoch)]

    def shard(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """This rank's batches of ``epoch`` from step ``start`` on, made one at a time: ``(n,)``
        int64 index arrays (maybe empty), equal to ``batches(epoch)[start:]``. Resuming at
        ``(epoch, start)`` costs one permutation of the batch order, not a replay of the epoch.
        """
        order = np.arange(len(self._global))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self._global))
        for i in order[start:]:
            yield self._global[i][self.rank :: self.world_size]
