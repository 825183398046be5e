"""The cost of ``fadat distill``: sentences/s of the AT teacher's beam search on training
sentences, fadat's PyTorch beam search against the CTranslate2 export (fadat.translation.export), at
1 and 2 threads, and how often the two engines give the same tokens.

Usage::

    .venv/bin/python bench/bench_distill.py --model AT_DIR --data DATA [--sentences 640] \
        [--beam 5] [--batch-size 64] [--threads 1 2]

Every ``N / sentences``-th training sentence is taken, ordered longest first and cut into
batches as ``fadat distill`` does; each engine translates them all once per thread count (one
warm-up batch first, not timed). "same" counts sentences whose outputs are identical; of the
others, "at limit" counts those where either engine's output reached the length limit
``int(1.2·|x </s>| + 10) − 1`` (where the two differ by design, see fadat.translation.export). The
machine is shared: the load average and the busiest other processes are printed with the table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from fadat.data.binarized import BinarizedDataset
from fadat.translation.distill import _translator


def busy_processes(n: int = 4) -> str:
    """The ``n`` processes using most CPU, as ``ps`` reports them (pid, %cpu, command)."""
    out = subprocess.run(
        ["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()[1 : n + 1]
    return "\n".join("  " + line.strip()[:110] for line in out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--sentences", type=int, default=640)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()

    train = BinarizedDataset(args.data, "train")
    step = max(1, len(train) // args.sentences)
    picked = list(range(0, len(train), step))[: args.sentences]
    picked.sort(key=lambda i: (-int(train.source_lengths[i]), i))
    sources = [train[i][0].tolist() for i in picked]
    batches = [sources[k : k + args.batch_size] for k in range(0, len(sources), args.batch_size)]
    limits = [int(1.2 * len(s) + 10) for s in sources]

    rows, outputs = [], {}
    with tempfile.TemporaryDirectory() as work:
        for threads in args.threads:
            for engine in ("fadat", "ctranslate2"):
                torch.set_num_threads(threads)
                translate = _translator(
                    engine, Path(args.model), Path(work), args.beam, 1.0, threads
                )
                translate(batches[-1])  # warm-up
                start = time.perf_counter()
                out = [y for batch in batches for y in translate(batch)]
                seconds = time.perf_counter() - start
                outputs[engine, threads] = out
                rows.append((engine, threads, len(out) / seconds, seconds))
    print(
        f"distillation cost: {len(sources)} training sentences of {args.data} (mean "
        f"{sum(map(len, sources)) / len(sources):.1f} source tokens), beam {args.beam}, "
        f"batches of {args.batch_size}, teacher {args.model}"
    )
    print(f"{'engine':<12} {'threads':>7} {'sent/s':>8} {'seconds':>8} {'same as fadat':>14}")
    for engine, threads, rate, seconds in rows:
        ours, theirs = outputs["fadat", threads], outputs[engine, threads]
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        at_limit = sum(
            a != b and max(len(a), len(b)) >= lim - 1
            for a, b, lim in zip(ours, theirs, limits, strict=True)
        )
        note = f"{same}/{len(ours)}" + (
            f" ({at_limit} of the rest at limit)" if same < len(ours) else ""
        )
        print(f"{engine:<12} {threads:>7} {rate:>8.1f} {seconds:>8.1f} {note:>14}")
    print(f"torch {torch.__version__}; load average {os.getloadavg()}; busiest processes:")
    print(busy_processes())


if __name__ == "__main__":
    main()
