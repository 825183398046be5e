"""TokenBatchSampler against brute-force checks; BinarizedDataset corruption errors; the
dataset's training digest (what it hashes, what it ignores)."""

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


def test_training_digest_hashes_the_files_a_run_reads(tmp_path):
    """:func:`training_digest`: the sha256 of ``NAME\\nSIZE\\n`` and the bytes of each file of
    :func:`training_files`, in that order: spm.model, the train and valid splits' ``.npy``
    files and the reference streams validation reads; nothing else of the directory."""
    import hashlib
    import re

    from fadat.data.binarized import raw_references, training_digest, training_files

    d = tmp_path / "d"
    (d / "raw").mkdir(parents=True)
    for split, first in (("train", 4), ("valid", 5), ("test", 6)):
        write_split(d, split, [[first, 2], [5, 6, 2]], [[0, 4, 2], [0, 2]], 10)
    files = {
        "spm.model": b"model",
        "raw/valid.ref.txt": b"r\ns\n",
        "raw/valid.ref2.txt": b"r2\ns2\n",
        # not read by a run:
        "spm.vocab": b"vocab",
        "meta.json": b'{"fingerprint": "x"}',
        ".fadat-output.json": b"{}",
        "raw/valid.src.txt": b"x\ny\n",
        "raw/valid.ref4.txt": b"no ref3: not a stream\n",
        "raw/test.src.txt": b"x\n",
        "raw/test.ref.txt": b"x\n",
    }
    for name, content in files.items():
        (d / name).write_bytes(content)
    splits = [f"{s}.{side}.{kind}.npy" for s in ("train", "valid") for side in ("src", "tgt")
              for kind in ("ids", "off")]  # fmt: skip
    names = training_files(d)
    assert names == ["spm.model", *splits, "raw/valid.ref.txt", "raw/valid.ref2.txt"]
    assert len(raw_references(d, "valid")) == 2  # the streams validation scores against
    expected = hashlib.sha256()
    for name in names:
        content = (d / name).read_bytes()
        expected.update(f"{name}\n{len(content)}\n".encode() + content)
    digest = training_digest(d)
    assert digest == expected.hexdigest() and re.fullmatch("[0-9a-f]{64}", digest)
    # what a run does not read plays no part
    unread = [n for n in files if n not in names] + ["test.src.ids.npy", "test.tgt.off.npy"]
    for name in unread:
        (d / name).write_bytes(b"changed")
    (d / "notes.txt").write_text("anything")
    assert training_digest(d) == digest
    # one changed byte of any file a run reads changes it
    for name in names:
        content = (d / name).read_bytes()
        (d / name).write_bytes(content[:-1] + bytes([content[-1] ^ 1]))
        assert training_digest(d) != digest, name
        (d / name).write_bytes(content)
    assert training_digest(d) == digest
    # so does a byte moved from one file to the next (each file's size is hashed)
    (d / "raw/valid.ref.txt").write_bytes(b"r\ns")
    (d / "raw/valid.ref2.txt").write_bytes(b"\nr2\ns2\n")
    assert training_digest(d) != digest
    (d / "raw/valid.ref.txt").write_bytes(files["raw/valid.ref.txt"])
    (d / "raw/valid.ref2.txt").write_bytes(files["raw/valid.ref2.txt"])
    # optional files (spm.model, the valid split, the references): one gone changes it
    for name in ("spm.model", "valid.tgt.off.npy", "raw/valid.ref2.txt"):
        (d / name).rename(tmp_path / "aside")
        assert name not in training_files(d) and training_digest(d) != digest, name
        (tmp_path / "aside").rename(d / name)
    assert training_digest(d) == digest
    # a train file is required, and named; so is the directory
    (d / "train.tgt.off.npy").unlink()
    with pytest.raises(InputError, match=r"d/train\.tgt\.off\.npy: missing"):
        training_digest(d)
    with pytest.raises(InputError, match="data directory .*nothing does not exist"):
        training_digest(tmp_path / "nothing")
    with pytest.raises(InputError, match="is not a directory"):
        training_digest(d / "spm.model")


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
