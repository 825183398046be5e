"""TokenBatchSampler against brute-force checks; BinarizedDataset corruption errors."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from fadat.data.batching import TokenBatchSampler, sentence_costs
from fadat.data.binarized import BinarizedDataset, write_split
from fadat.errors import InputError


def lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, n), rng.integers(3, 80, n)


def test_costs_match_formula():
    src, tgt = np.array([1, 3, 10, 50]), np.array([3, 30, 5, 4])
    # max(src, tgt, clip(int(2.5 * src), 2, 100))
    expected = [max(s, t, min(max(int(2.5 * s), 2), 100)) for s, t in zip(src, tgt, strict=True)]
    assert sentence_costs(src, tgt, 2.5, 100).tolist() == expected


@pytest.mark.parametrize("world_size", [1, 3])
def test_batches_cover_once_and_respect_budget(world_size):
    src, tgt = lengths(2000)
    costs = sentence_costs(src, tgt, 3.0)
    samplers = [
        TokenBatchSampler(src, tgt, 600, 3.0, seed=7, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    per_rank = [s.batches(2) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1  # same number of steps on every rank
    # step k's global batch: the ranks' shards together
    glob = [sorted(i for b in step for i in b) for step in zip(*per_rank, strict=True)]
    flat = sorted(i for b in glob for i in b)
    assert flat == list(range(2000))
    for k, g in enumerate(glob):
        assert len(g) * costs[g].max() <= 600 * world_size
        shards = [per_rank[r][k] for r in range(world_size)]
        # rank r takes every world_size-th sentence of the step: shard sizes differ by <= 1
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        assert all(len(s) * costs[s].max() <= 600 for s in shards if s) or world_size > 1


def test_deterministic_shuffled_and_resumable():
    src, tgt = lengths(500, 1)
    a = TokenBatchSampler(src, tgt, 400, 2.0, seed=3)
    b = TokenBatchSampler(src, tgt, 400, 2.0, seed=3)
    assert a.batches(0) == b.batches(0) and a.batches(5) == b.batches(5)
    assert a.batches(0) != a.batches(1)  # order shuffled per epoch
    assert a.num_batches(0) == len(a.batches(0))
    assert a.batches(4)[7:] == b.batches(4)[7:]  # resume at (4, 7)
    unshuffled = TokenBatchSampler(src, tgt, 400, 2.0, shuffle=False).batches(0)
    costs = sentence_costs(src, tgt, 2.0)
    maxima = [costs[b].max() for b in unshuffled]
    assert maxima == sorted(maxima)  # length-bucketed


def test_greedy_batches_are_maximal():
    src, tgt = lengths(300, 2)
    s = TokenBatchSampler(src, tgt, 500, 2.0, shuffle=False)
    costs = sentence_costs(src, tgt, 2.0)
    batches = s.batches(0)
    for b, nxt in zip(batches, batches[1:], strict=False):
        grown = b + nxt[:1]
        assert (len(grown)) * costs[grown].max() > 500


def test_oversized_pair_alone_with_warning():
    src, tgt = np.array([5, 200, 6]), np.array([5, 5, 6])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = TokenBatchSampler(src, tgt, 100, 1.0, shuffle=False)
    assert any("exceed" in str(w.message) for w in caught)
    assert s.batches(0) == [[0, 2], [1]]


def test_empty_shards_kept():
    src, tgt = np.array([4]), np.array([4])
    s = [TokenBatchSampler(src, tgt, 100, 1.0, rank=r, world_size=2) for r in range(2)]
    assert s[0].batches(0) == [[0]] and s[1].batches(0) == [[]]


def _dataset(tmp_path, sources, targets, pairs=None, vocab=10):
    import json

    write_split(tmp_path, "train", sources, targets, vocab)
    meta = {"vocab_size": vocab, "splits": {"train": {"pairs": pairs or len(sources)}}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))


def test_dataset_errors_name_the_file(tmp_path):
    _dataset(tmp_path, [[4, 2], [5, 6, 2]], [[0, 4, 2], [0, 2]])
    ds = BinarizedDataset(tmp_path, "train")
    assert ds[1][0].tolist() == [5, 6, 2] and ds.target_lengths.tolist() == [3, 2]
    np.save(tmp_path / "train.src.off.npy", np.array([0, 2, 9], dtype=np.int64))
    with pytest.raises(InputError, match="train.src.off.npy: offsets inconsistent"):
        BinarizedDataset(tmp_path, "train")
    _dataset(tmp_path, [[4, 2], [5, 12, 2]], [[0, 4, 2], [0, 2]], vocab=300)
    meta = json.loads((tmp_path / "meta.json").read_text())
    (tmp_path / "meta.json").write_text(json.dumps({**meta, "vocab_size": 10}))
    ds = BinarizedDataset(tmp_path, "train")  # ids are checked when a sentence is read
    assert ds[0][0].tolist() == [4, 2]
    with pytest.raises(InputError, match="train.src.ids.npy: token id 12 of sentence 1 outside"):
        ds.collate([0, 1])
    _dataset(tmp_path, [[4, 2]], [[0, 4, 2]], pairs=2)
    with pytest.raises(InputError, match="meta.json says 2"):
        BinarizedDataset(tmp_path, "train")
    _dataset(tmp_path, [[4, 2]], [[0, 4, 2]])
    (tmp_path / "train.tgt.ids.npy").unlink()
    with pytest.raises(InputError, match="train.tgt.ids.npy: missing"):
        BinarizedDataset(tmp_path, "train")
    with pytest.raises(InputError, match="meta.json: not found"):
        BinarizedDataset(tmp_path / "nothing", "train")


def _greedy_reference(costs: list[int], budget: int) -> list[int]:
    """Sentence by sentence: extend while the padded cost fits."""
    ends, start = [], 0
    while start < len(costs):
        end = start + 1
        while end < len(costs) and (end + 1 - start) * costs[end] <= budget:
            end += 1
        ends.append(end)
        start = end
    return ends


@pytest.mark.parametrize("seed", range(20))
def test_greedy_batch_ends_against_sentence_by_sentence(seed):
    from fadat.data.batching import greedy_batch_ends

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    costs = np.sort(rng.integers(1, int(rng.choice([5, 50, 400])), n))
    budget = int(rng.integers(1, 600))
    assert greedy_batch_ends(costs, budget) == _greedy_reference(costs.tolist(), budget)


def test_shard_is_the_lazy_tail_of_batches():
    src, tgt = lengths(500, 3)
    for rank in range(3):
        s = TokenBatchSampler(src, tgt, 200, 2.0, seed=4, rank=rank, world_size=3)
        full = s.batches(2)
        assert len(full) == s.num_batches()
        for start in (0, 1, 7, len(full)):
            tail = list(s.shard(2, start))
            assert [b.tolist() for b in tail] == full[start:]
            assert all(b.dtype == np.int64 for b in tail)
