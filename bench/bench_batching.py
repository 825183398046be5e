"""Batch-plan benchmark: ``TokenBatchSampler`` on WMT-size length arrays, against the previous
plan in the same run.

``new``: ``fadat.data.batching`` (runs of equal cost, a radix sort of the costs, the epoch's
batches made one at a time by ``shard``). ``reference``: the previous implementation, kept here
as the plain version — a sort with the same tie order, a window search per batch, and every
batch of the epoch made as Python lists of indices (``batches(epoch)``, then remapped as the
trainer did). Both must give the same batches (checked on the first 1,000 steps of an epoch).
Prints CPU seconds (of the measuring process, all its threads: the machine may be shared, wall
time would measure the other jobs) and the growth of the peak RSS for building the plan and for
having the first 1,000 steps' batches of rank 0 of 2 (the reference makes the whole epoch's list
for that).

    python bench/bench_batching.py --pairs 4500000

Lengths are drawn log-normal (median source ≈ 27 tokens, as a WMT corpus with an 8k-32k BPE
vocabulary), targets ≈ 1.05 × source. The machine may be shared: the two are run one after the
other, the reference second, in separate processes (each column's RSS is its own process's).
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import time
import warnings

import numpy as np


def lengths(pairs: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = np.clip(np.rint(rng.lognormal(3.3, 0.6, pairs)), 2, 1024).astype(np.int64)
    tgt = np.clip(np.rint(src * rng.lognormal(0.05, 0.15, pairs)), 3, 1024).astype(np.int64)
    return src, tgt


def reference_batches(costs: np.ndarray, budget: int, seed: int) -> list[np.ndarray]:
    """The previous plan: sort, then a window search per batch."""
    n = len(costs)
    tie = np.random.default_rng([seed, 2**31 - 1]).permutation(n)
    order = tie[np.argsort(costs[tie], kind="stable")]
    costs = costs[order]
    batches, start = [], 0
    while start < n:
        stop = min(n, start + budget // max(int(costs[start]), 1) + 1)
        ends = np.arange(start + 1, stop + 1)
        ok = (ends - start) * costs[ends - 1] <= budget
        k = int(np.argmin(ok)) if not ok.all() else len(ok)
        batches.append(order[start : start + max(k, 1)])
        start += max(k, 1)
    return batches


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(which: str, pairs: int, max_tokens: int, world: int) -> dict:
    from fadat.data.batching import TokenBatchSampler, sentence_costs

    src, tgt = lengths(pairs)
    keep = np.arange(pairs)  # the trainer's usable indices
    base = peak_mib()
    t0 = time.process_time()
    if which == "new":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = TokenBatchSampler(src, tgt, max_tokens, 4.0, 1024, seed=1, world_size=world)
        plan = time.process_time() - t0
        t1 = time.process_time()
        shard = sampler.shard(1)  # made one batch at a time, as the trainer takes them
        first = [keep[b].tolist() for b in itertools.islice(shard, 1000)]
        steps = len(first) + sum(1 for _ in shard)
    else:
        costs = sentence_costs(src, tgt, 4.0, 1024)
        glob = reference_batches(costs, max_tokens * world, seed=1)
        plan = time.process_time() - t0
        t1 = time.process_time()
        order = np.random.default_rng([1, 1]).permutation(len(glob))
        mine = [glob[i].tolist()[0::world] for i in order]
        first = [[int(keep[i]) for i in b] for b in mine]  # the epoch's list, as before
        steps = len(first)
    epoch = time.process_time() - t1
    digest = hash(tuple(tuple(b) for b in first[:1000]))
    return {
        "which": which,
        "plan_s": round(plan, 2),
        "epoch_s": round(epoch, 2),
        "rss_growth_mib": round(peak_mib() - base),
        "batches": steps,
        "digest": digest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--only", choices=("new", "reference"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run(args.only, args.pairs, args.max_tokens, args.world_size)))
        return
    rows = []
    for which in ("new", "reference"):
        cmd = [sys.executable, __file__, "--only", which, "--pairs", str(args.pairs),
               "--max-tokens", str(args.max_tokens),
               "--world-size", str(args.world_size)]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    same = rows[0]["digest"] == rows[1]["digest"] and rows[0]["batches"] == rows[1]["batches"]
    print(f"{args.pairs:,} pairs, --max-tokens {args.max_tokens}, rank 0 of {args.world_size}; "
          f"same batches: {same}; other work may share the machine")  # fmt: skip
    print(
        "| plan | build (CPU s) | first 1,000 steps' batches (CPU s) | peak RSS growth (MiB) "
        "| steps |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['which']} | {r['plan_s']} | {r['epoch_s']} | {r['rss_growth_mib']} | "
              f"{r['batches']} |")  # fmt: skip


if __name__ == "__main__":
    main()
