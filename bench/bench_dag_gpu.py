"""Benchmark the Triton DAG kernels against fadat.dag's PyTorch path on one GPU (prints a table).

Same inputs for both backends (bench/bench_dag.py's model-like graphs: links preferring jumps of
≈ L/T, one peaked reference token per target position; float32), for each size ``BxL`` with
``T`` target positions:

- ``likelihood``: forward + backward of ``dag_log_likelihood_from_match`` from a ``match`` leaf
  (the DP alone; the gather and the (B, L, V) log-softmax are the same for both backends);
- ``alignment``: ``best_alignment_from_match`` (forward only).

Statistic: median over ``--repeats`` timed calls of each backend, interleaved, after ``--warmup``
untimed calls (default 2: the first compiles the kernels), timed with CUDA events; the ratio is
torch / triton.
Memory: the peak of ``torch.cuda.max_memory_allocated`` during one call above what was allocated
before it. The table also shows the largest difference between the backends' log-likelihoods,
gradients and alignments, as a check that both computed the same thing.

Usage: ``python bench/bench_dag_gpu.py [--sizes 64x240,256x240] [--repeats 20] [--warmup 2]
[--block 32] [--warps 4] [--json FILE]`` (T = 30, so λ = L / 30: 8 at L = 240, the paper's;
``--block`` / ``--warps`` try other launch configurations than the library's fixed one;
``--json`` writes the table's rows to FILE after every row, so that a run cut short keeps what it
measured).
Exits with status 2 and a message where CUDA or Triton is missing. ``--device cpu`` runs the same
code on the CPU (the Triton side then needs ``TRITON_INTERPRET=1``): a dry run of this script,
its timings mean nothing; ``--warmup 0`` there (the interpreter compiles nothing, and each of its
calls takes seconds), the differences and peaks then come from the first timed call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
from bench_dag import STEPS, link_logprobs, make_inputs

from fadat import dag
from fadat.kernels import triton_dag

BACKENDS = ("torch", "triton")


def inputs(batch: int, size: int, device: torch.device):
    """float32 ``(match, links, graph_lengths, target_lengths)`` on ``device``; graph sizes
    ragged between L/2 and L (one sentence at L), ``T_b = L_b · T / L`` (the same λ for every
    sentence), as in a length-bucketed batch."""
    logits, scores, targets, _, _ = make_inputs(batch, size)
    gen = torch.Generator().manual_seed(batch * size)
    glen = torch.randint(max(size // 2, STEPS), size + 1, (batch,), generator=gen)
    glen[0] = size
    tlen = torch.clamp(glen * STEPS // size, min=2)
    links = link_logprobs(scores, glen)
    match = dag.gather_match(torch.log_softmax(logits, -1), targets[:, : int(tlen.max())])
    return match.to(device), links.to(device), glen.to(device), tlen.to(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[float, float, object]:
    """(milliseconds, peak extra MiB, result) of one call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        return start.elapsed_time(end), peak, out
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, float("nan"), out


def likelihood_call(match, links, glen, tlen, backend: str):
    def run():
        leaf = match.detach().requires_grad_()
        links_leaf = links.detach().requires_grad_()
        ll = dag.dag_log_likelihood_from_match(leaf, links_leaf, glen, tlen, backend=backend)
        ll.sum().backward()
        return ll.detach(), leaf.grad, links_leaf.grad

    return run


def alignment_call(match, links, glen, tlen, backend: str):
    return lambda: dag.best_alignment_from_match(match, links, glen, tlen, backend=backend)


def max_diff(a, b) -> float:
    """Largest absolute difference between two results (tuples of tensors or one tensor)."""
    pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
    out = 0.0
    for x, y in pairs:
        finite = torch.isfinite(x) & torch.isfinite(y)
        if not torch.equal(torch.isfinite(x), torch.isfinite(y)):
            return float("inf")
        if finite.any():
            out = max(out, float((x[finite].double() - y[finite].double()).abs().max()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16x120,64x240,256x240,64x480")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before the timed ones")
    parser.add_argument("--tasks", default="likelihood,alignment")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--block", type=int, default=triton_dag.BLOCK, help="Triton tile edge (a power of 2)"
    )
    parser.add_argument("--warps", type=int, default=triton_dag.NUM_WARPS, help="Triton warps")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        print("bench_dag_gpu: --repeats must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    if args.block < 1 or args.block & (args.block - 1):
        print(f"bench_dag_gpu: --block must be a power of 2, got {args.block}", file=sys.stderr)
        return 2
    # The launch configuration is a module constant (fixed, so that the interpreter tests run
    # what a GPU runs); the benchmark may try others.
    triton_dag.BLOCK, triton_dag.NUM_WARPS = args.block, args.warps
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "bench_dag_gpu: needs a CUDA device (torch.cuda.is_available() is False)",
            file=sys.stderr,
        )
        return 2
    if not triton_dag.triton_importable():
        print("bench_dag_gpu: needs the triton package (pip install triton)", file=sys.stderr)
        return 2
    calls = {"likelihood": likelihood_call, "alignment": alignment_call}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(f"# {where}; torch {torch.__version__}; Triton block {triton_dag.BLOCK}, "
          f"{triton_dag.NUM_WARPS} warps; T = {STEPS}; median of {args.repeats}")  # fmt: skip
    header = (
        "| task | B | L | torch ms | triton ms | torch/triton | torch MiB | triton MiB | max Δ |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    report = {
        "device": where,
        "torch": torch.__version__,
        "block": triton_dag.BLOCK,
        "warps": triton_dag.NUM_WARPS,
        "steps": STEPS,
        "repeats": args.repeats,
        "rows": [],
    }
    for task in args.tasks.split(","):
        for spec in args.sizes.split(","):
            batch, size = (int(x) for x in spec.split("x"))
            data = inputs(batch, size, device)
            fns = {b: calls[task](*data, backend=b) for b in BACKENDS}
            times: dict[str, list[float]] = {b: [] for b in BACKENDS}
            peaks: dict[str, float] = {}
            results = {}
            for b in BACKENDS:  # warm-up (compiles the Triton kernels for this shape class)
                for _ in range(args.warmup):
                    _, peaks[b], results[b] = timed(fns[b], device)
            for _ in range(args.repeats):
                for b in BACKENDS:
                    ms, peak, result = timed(fns[b], device)
                    times[b].append(ms)
                    # without a warm-up, the first timed call's peak and result
                    peaks.setdefault(b, peak)
                    results.setdefault(b, result)
            med = {b: statistics.median(times[b]) for b in BACKENDS}
            diff = max_diff(results["torch"], results["triton"])
            print(
                f"| {task} | {batch} | {size} | {med['torch']:.2f} | {med['triton']:.2f} | "
                f"{med['torch'] / med['triton']:.1f}x | {peaks['torch']:.0f} | "
                f"{peaks['triton']:.0f} | {diff:.1e} |"
            )
            report["rows"].append(
                {
                    "task": task,
                    "batch": batch,
                    "size": size,
                    "torch_ms": med["torch"],
                    "triton_ms": med["triton"],
                    "speedup": med["torch"] / med["triton"],
                    "torch_mib": peaks["torch"],
                    "triton_mib": peaks["triton"],
                    # the largest difference of log P, both gradients (likelihood) or the path
                    "max_diff": diff,
                }
            )
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
