"""Benchmark fadat.dag against paper-literal references (not a test; prints a table).

For B ∈ {16, 64}, L ∈ {120, 240}, T = 30, V = 8000 on 2 threads, with the same random inputs
for both sides (links preferring jumps of ≈ L/T like a trained model's, one peaked reference
token per target position), it times forward + backward of

- likelihood: ``fadat.dag.dag_log_likelihood`` vs a per-target-step
  ``logsumexp(f[:, :, None] + links, 1)`` loop under autograd (docs/reference-behaviour.md, "DAG
  likelihood" torch reference), end to end from ``token_logprobs`` (both sides pay the same gather
  and dense (B, L, V) gradient) and, as ``likelihood_dp``, the DP alone from a ``match`` leaf;
- alignment: ``fadat.dag.best_alignment`` vs a per-step max-product DP with back-pointers
  (``torch.max`` with indices) and a back-pointer walk (forward only: no gradient);
- fuzzy: ``fadat.dag.fuzzy_alignment`` (n = 2) vs Algorithm 1 as in the FA-DAT code: a
  ``torch.cat`` loop for the passing probabilities, a Python n-gram table and a gather from
  ``probs.unsqueeze(1).expand(B, K, L, V)`` (docs/reference-behaviour.md, "Fuzzy alignment loss").

Statistic: median over ≥ 7 interleaved (ours, reference) pairs of the time ratio, after one
warm-up call of each. Memory: peak RSS increase of one call, each in a fresh subprocess (peak
reset through /proc/self/clear_refs). The fuzzy reference is skipped where its dense
(B, K, L, V) gradients would not fit in half of the available memory.

Usage: ``python bench/bench_dag.py [--repeats 7] [--sizes 16x120,64x240] [--tasks fuzzy]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter

# The memory settings the `fadat` command makes (fadat.process.tune_memory: huge pages for torch's
# large allocations, glibc keeping freed blocks); torch reads the huge-page setting once, so it
# must precede the torch import. Both sides of every comparison run in this process and share it.
from fadat.process import tune_memory  # noqa: E402

tune_memory()

import torch  # noqa: E402

from fadat import dag  # noqa: E402

VOCAB = 8000
STEPS = 30
THREADS = 2


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def make_inputs(batch: int, size: int, seed: int = 0):
    """Model-like float32 inputs; returns (logits, scores, targets, graph_lengths, lengths)."""
    gen = torch.Generator().manual_seed(seed + 1000 * batch + size)
    glen = torch.full((batch,), size, dtype=torch.int64)
    tlen = torch.full((batch,), STEPS, dtype=torch.int64)
    targets = torch.randint(4, VOCAB, (batch, STEPS), generator=gen)
    targets[:, 0], targets[:, -1] = 0, 2  # <s> … </s>
    # Token logits: noise, plus a peak on the reference token of the position each vertex
    # "belongs to" (vertex j ↔ target position ≈ j·T/L).
    logits = torch.randn(batch, size, VOCAB, generator=gen)
    pos = (torch.arange(size) * STEPS // size).clamp(max=STEPS - 1)  # (L,)
    peak = targets[:, pos]  # (B, L)
    logits.scatter_add_(2, peak[..., None], torch.full((batch, size, 1), 8.0))
    # Links: prefer jumps of ≈ λ = L/T (Gaussian in the jump length), plus noise.
    lam = size / STEPS
    idx = torch.arange(size, dtype=torch.float32)
    jump = idx[None, :] - idx[:, None]  # (L, L)
    scores = -((jump - lam) ** 2) / (2 * (lam / 2) ** 2) + torch.randn(
        batch, size, size, generator=gen
    )
    return logits, scores, targets, glen, tlen


def link_logprobs(scores: torch.Tensor, glen: torch.Tensor) -> torch.Tensor:
    size = scores.shape[1]
    idx = torch.arange(size)
    valid = (idx[None, :, None] < idx[None, None, :]) & (idx[None, None, :] < glen[:, None, None])
    logp = torch.log_softmax(scores.masked_fill(~valid, -1e9), dim=-1)
    return logp.masked_fill(~valid, float("-inf"))


# ---------------------------------------------------------------------------------------------
# Paper-literal references
# ---------------------------------------------------------------------------------------------


def ref_log_likelihood(logp, links, targets, glen, tlen):
    """Per-target-step logsumexp loop under autograd (O(T·B·L²) autograd memory)."""
    batch, size, _ = logp.shape
    match = logp.gather(2, targets[:, None, :].expand(batch, size, targets.shape[1]))
    return ref_log_likelihood_from_match(match.transpose(1, 2), links, glen, tlen)


def ref_log_likelihood_from_match(match, links, glen, tlen):
    """The docs/reference-behaviour.md, "DAG likelihood" torch reference DP on a (B, T, L) match
    tensor."""
    batch, _, size = match.shape
    f = torch.full((batch, size), float("-inf"))
    f = torch.cat([match[:, 0, :1], f[:, 1:]], 1)
    values = []
    for t in range(1, match.shape[1]):
        f = torch.logsumexp(f[:, :, None] + links, 1) + match[:, t]
        values.append(f)
    f_all = torch.stack(values, 1)  # (B, T-1, L)
    rows = torch.arange(batch)
    # (T_b ≥ 2 here: every bench sentence is <s> … </s>.)
    return f_all[rows, tlen - 2, glen - 1]


@torch.no_grad()
def ref_best_alignment(logp, links, targets, glen, tlen):
    """Max-product DP with back-pointers (torch.max with indices), then a walk back."""
    batch, size, _ = logp.shape
    match = logp.gather(2, targets[:, None, :].expand(batch, size, targets.shape[1]))
    match = match.transpose(1, 2)  # (B, T, L)
    f = torch.full((batch, size), float("-inf"))
    f[:, 0] = match[:, 0, 0]
    pointers = []
    for t in range(1, targets.shape[1]):
        f, arg = (f[:, :, None] + links).max(1)
        f = f + match[:, t]
        pointers.append(arg)
    rows = torch.arange(batch)
    path = torch.full((batch, size), -1, dtype=torch.int64)
    cur = glen - 1
    for t in range(targets.shape[1] - 1, 0, -1):
        path[rows, cur] = t
        cur = pointers[t - 1][rows, cur]
    path[rows, cur] = 0
    return path


def ref_fuzzy_score(logp, links, targets, glen, tlen, order=2):
    """Algorithm 1 as in the FA-DAT code: torch.cat passing loop, Python n-gram table,
    gather from a (B, K, L, V) expansion."""
    batch, size, vocab = logp.shape
    trans = links.exp()  # (B, L, L)
    p = torch.ones(batch, 1)
    for j in range(1, size):
        p = torch.cat([p, (p * trans[:, :j, j]).sum(1, keepdim=True)], 1)
    grams, counts = [], []
    for b in range(batch):
        seq = targets[b, : int(tlen[b])].tolist()
        c = Counter(tuple(seq[k : k + order]) for k in range(len(seq) - order + 1))
        grams.append(list(c.keys()))
        counts.append(list(c.values()))
    width = max(len(g) for g in grams)
    gram_t = torch.ones(batch, width, order, dtype=torch.int64)
    count_t = torch.zeros(batch, width)
    for b in range(batch):
        gram_t[b, : len(grams[b])] = torch.tensor(grams[b])
        count_t[b, : len(counts[b])] = torch.tensor(counts[b], dtype=torch.float32)
    probs = logp.exp().unsqueeze(1).expand(batch, width, size, vocab)  # (B, K, L, V)

    def tok(i):
        index = gram_t[:, :, i][:, :, None, None].expand(batch, width, size, 1)
        return probs.gather(3, index).squeeze(-1)  # (B, K, L)

    c1 = p.unsqueeze(1)  # (B, 1, L)
    c2 = p.unsqueeze(1) * tok(0)  # (B, K, L)
    for i in range(1, order):
        c1 = torch.bmm(c1, trans)
        c2 = torch.bmm(c2, trans) * tok(i)
    expected = c2.sum(-1)  # (B, K)
    clipped = torch.minimum(expected, count_t).sum(-1)
    precision = clipped / c1.sum((1, 2))
    brevity = torch.clamp(torch.exp(1 - tlen / p.sum(-1)), max=1.0)
    return brevity * precision


# ---------------------------------------------------------------------------------------------
# Calls (forward + backward where there is a gradient)
# ---------------------------------------------------------------------------------------------


def leaves(task, logits, scores, targets, glen):
    """Leaf tensors of a call: (token_logprobs, links), or (match, links) for likelihood_dp."""
    logp = logits.log_softmax(-1).detach()
    if task == "likelihood_dp":
        logp = dag.gather_match(logp, targets)  # (B, T, L)
    links = link_logprobs(scores, glen).detach().requires_grad_()
    return logp.requires_grad_(), links


def run(task: str, impl: str, logp, links, targets, glen, tlen):
    logp.grad = links.grad = None
    if task == "likelihood":
        fn = dag.dag_log_likelihood if impl == "ours" else ref_log_likelihood
        loss = -fn(logp, links, targets, glen, tlen).mean()
        loss.backward()
        return float(loss.detach())
    if task == "likelihood_dp":  # the DP alone: match is the leaf (logp holds it here)
        fn = dag.dag_log_likelihood_from_match if impl == "ours" else ref_log_likelihood_from_match
        loss = -fn(logp, links, glen, tlen).mean()
        loss.backward()
        return float(loss.detach())
    if task == "alignment":
        fn = dag.best_alignment if impl == "ours" else ref_best_alignment
        return fn(logp.detach(), links.detach(), targets, glen, tlen)
    if impl == "ours":
        score = dag.fuzzy_alignment(logp, links, targets, glen, tlen, order=2).score
    else:
        score = ref_fuzzy_score(logp, links, targets, glen, tlen, order=2)
    loss = -score.mean()
    loss.backward()
    return float(loss.detach())


def fuzzy_ref_bytes(batch: int, size: int) -> int:
    # Dense (B, K, L, V) float32 gradients of the expanded gathers (one per n-gram position,
    # summed by autograd: 2 alive at the peak, as measured), K = T − 1 distinct bigrams.
    return 2 * batch * (STEPS - 1) * size * VOCAB * 4


def available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------------------------------
# Memory probe (fresh subprocess per measurement)
# ---------------------------------------------------------------------------------------------


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def memory_probe(task: str, impl: str, batch: int, size: int) -> None:
    torch.set_num_threads(THREADS)
    logits, scores, targets, glen, tlen = make_inputs(batch, size)
    logp, links = leaves(task, logits, scores, targets, glen)
    del logits, scores
    gc.collect()
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    run(task, impl, logp, links, targets, glen, tlen)
    peak = _rss_kib("VmHWM")
    print(json.dumps({"mib": (peak - before) / 1024}))


def measure_memory(task: str, impl: str, batch: int, size: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--probe", task, impl, str(batch), str(size)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": str(THREADS)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["mib"]


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def time_pair(task, batch, size, repeats):
    logits, scores, targets, glen, tlen = make_inputs(batch, size)
    logp, links = leaves(task, logits, scores, targets, glen)
    del logits, scores
    args = (logp, links, targets, glen, tlen)
    # Same inputs, so the two sides must agree (a bench of wrong code is worthless).
    if task == "alignment":
        ours, ref = run(task, "ours", *args), run(task, "ref", *args)
        assert torch.equal(ours, ref), "alignment differs from reference"
    else:
        ours, ref = run(task, "ours", *args), run(task, "ref", *args)
        assert abs(ours - ref) <= 1e-4 * max(1.0, abs(ref)), (task, ours, ref)
    ratios, t_ours, t_ref = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        run(task, "ours", *args)
        mid = time.perf_counter()
        run(task, "ref", *args)
        end = time.perf_counter()
        t_ours.append(mid - start)
        t_ref.append(end - mid)
        ratios.append((end - mid) / (mid - start))
    return statistics.median(t_ours), statistics.median(t_ref), statistics.median(ratios)


def bench_ngram_table(repeats: int) -> tuple[float, float]:
    """The reference n-gram table: Python Counter loop vs fadat's tensor build (B=64, T=30)."""
    _, _, targets, _, tlen = make_inputs(64, 240)

    def python_table():
        for b in range(targets.shape[0]):
            seq = targets[b, : int(tlen[b])].tolist()
            Counter(tuple(seq[k : k + 2]) for k in range(len(seq) - 1))

    times = {"python": [], "tensor": []}
    for _ in range(repeats):
        for name, fn in (
            ("python", python_table),
            ("tensor", lambda: dag.reference_ngrams(targets, tlen, 2)),
        ):
            start = time.perf_counter()
            for _ in range(20):
                fn()
            times[name].append((time.perf_counter() - start) / 20)
    return statistics.median(times["python"]), statistics.median(times["tensor"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="16x120,16x240,64x120,64x240")
    parser.add_argument("--tasks", default="likelihood_dp,likelihood,alignment,fuzzy")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--probe", nargs=4, metavar=("TASK", "IMPL", "B", "L"))
    args = parser.parse_args()
    if args.probe:
        task, impl, batch, size = args.probe
        memory_probe(task, impl, int(batch), int(size))
        return
    torch.set_num_threads(args.threads)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    budget = available_bytes() // 2
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, T={STEPS}, V={VOCAB}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}"
    )
    header = (
        f"{'task':<14}{'B':>4}{'L':>5}{'ours ms':>10}{'ref ms':>10}{'speed-up':>10}"
        f"{'ours MiB':>10}{'ref MiB':>10}{'mem ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for task in args.tasks.split(","):
        for batch, size in sizes:
            if task == "fuzzy" and fuzzy_ref_bytes(batch, size) > budget:
                need = fuzzy_ref_bytes(batch, size) / 2**30
                print(f"{task:<14}{batch:>4}{size:>5}   reference skipped: needs > {need:.1f} GiB")
                continue
            t_ours, t_ref, ratio = time_pair(task, batch, size, args.repeats)
            m_ours = measure_memory(task, "ours", batch, size)
            m_ref = measure_memory(task, "ref", batch, size)
            print(
                f"{task:<14}{batch:>4}{size:>5}{t_ours * 1e3:>10.1f}{t_ref * 1e3:>10.1f}"
                f"{ratio:>9.1f}x{m_ours:>10.1f}{m_ref:>10.1f}{m_ref / max(m_ours, 1e-3):>9.1f}x",
                flush=True,
            )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    py, tens = bench_ngram_table(args.repeats)
    print(
        f"\nreference bigram table, B=64, T=30: python Counter {py * 1e3:.2f} ms, "
        f"tensor unique {tens * 1e3:.2f} ms ({py / tens:.1f}x)"
    )


if __name__ == "__main__":
    main()
