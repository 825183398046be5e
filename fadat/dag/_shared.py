"""What the DAG programmes of :mod:`fadat.dag` share: length checks, the valid-links mask, the
flushed ``exp`` of the probability-space programmes, the choice of the Triton kernels, and the
cache-sized chunks of sentences they run in side by side. Private to the package.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

_NEG_INF = float("-inf")
_T = TypeVar("_T")


def _check_lengths(lengths: torch.Tensor, size: int, name: str) -> None:
    """Raise ValueError unless ``lengths`` is a (B,) integer tensor with values in [1, size]."""
    if lengths.dim() != 1 or lengths.dtype.is_floating_point:
        raise ValueError(f"{name} must be a (B,) integer tensor, got {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.max()) > size):
        raise ValueError(f"{name} must lie in [1, {size}], got {lengths.tolist()}")


def _valid_links(graph_lengths: torch.Tensor, size: int) -> torch.Tensor:
    """(B, L, L) bool: the transitions i → j that exist, ``i < j < L_b``."""
    idx = torch.arange(size, device=graph_lengths.device)
    upper = idx[None, :, None] < idx[None, None, :]  # (1, L, L)
    inside = idx[None, None, :] < graph_lengths[:, None, None]  # (B, 1, L)
    return upper & inside  # (B, L, L)


def _masked_links(links: torch.Tensor, graph_lengths: torch.Tensor) -> torch.Tensor:
    """``links`` with −inf outside the valid triangle (so padding content never matters)."""
    if links.dim() != 3 or links.shape[1] != links.shape[2]:
        raise ValueError(f"links must be (B, L, L), got {tuple(links.shape)}")
    _check_lengths(graph_lengths, links.shape[1], "graph_lengths")
    valid = _valid_links(graph_lengths, links.shape[1])  # (B, L, L)
    return torch.where(valid, links, _NEG_INF)  # (B, L, L)


def _use_triton(tensor: torch.Tensor, backend: str) -> bool:
    """Whether a DP on ``tensor`` runs in the Triton kernels (:mod:`fadat.kernels.triton_dag`;
    ``backend`` is ``"auto"``, ``"torch"`` or ``"triton"``, see
    :func:`fadat.kernels.triton_dag.use_triton`). Imports nothing of Triton for ``"torch"`` or a
    CPU tensor under ``"auto"``."""
    if backend == "torch" or (backend == "auto" and not tensor.is_cuda):
        return False
    from fadat.kernels import triton_dag

    return triton_dag.use_triton(tensor, backend)


def _exp_floor(dtype: torch.dtype) -> float:
    """The log of the smallest normal number of ``dtype``, rounded up a little (f32: −86.8)."""
    return math.log(torch.finfo(dtype).tiny) + 0.5


def _flushed_exp(x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``exp(x)``, with results below ``exp(_exp_floor)`` (≈ 2e−38 in float32) set to exactly 0
    (and entries where the bool ``keep`` is False, if given, too). Not for autograd.

    On CPU, ``torch.exp`` leaves its vectorised path when a result is subnormal or underflows:
    measured on (64, 240, 240) float32 inputs, 4.6 ms at −87.3 but 205 ms at −88 and 60–75 ms
    below −104 (results 0). Link log-probabilities of far jumps lie there, so the exponent is
    clamped first and those entries are zeroed after: the values flush-to-zero arithmetic would
    give. −inf maps to 0.
    """
    floor = _exp_floor(x.dtype)
    small = x < floor  # (same shape as x)
    if keep is not None:
        small |= ~keep
    return x.clamp(min=floor).exp_().masked_fill_(small, 0.0)


# On CPU the per-step matvecs are memory-bound when E of the whole batch is streamed from RAM at
# every target step; running the DP on chunks of sentences whose E stays in cache is ~3x faster.
_CHUNK_BYTES = 4 * 2**20


def _chunks(batch: int, size: int, tensor: torch.Tensor, workers: int = 1) -> list[slice]:
    """Sentence slices for the per-step DP loops: whole batch on GPU, cache-sized on CPU.

    On CPU the number of slices is rounded up to a multiple of ``workers`` and the slices are
    made equal, so that :func:`_map_chunks` keeps every worker equally busy.
    """
    if tensor.device.type != "cpu":
        return [slice(0, batch)]
    step = max(1, _CHUNK_BYTES // (size * size * tensor.element_size()))
    count = -(-batch // step)
    count = -(-count // workers) * workers
    step = -(-batch // count)
    return [slice(s, min(s + step, batch)) for s in range(0, batch, step)]


@contextlib.contextmanager
def _serial_on_cpu(tensor: torch.Tensor) -> Iterator[int]:
    """Run the per-step DP loops on one intra-op thread on CPU (restored afterwards).

    Each step's ops are small (one chunk of sentences), so an OpenMP fork/join per op gains
    little, and when the cores are oversubscribed every join waits for a descheduled thread:
    measured 10 s vs 1 s for the B=64, L=240 likelihood on 2 busy cores. Instead the chunks run
    side by side on Python threads (:func:`_map_chunks`; torch ops release the GIL). Yields the
    number of such workers: the previous intra-op thread count on CPU, 1 elsewhere. Note that
    this changes ``torch.get_num_threads()`` process-wide for the duration of the loop.
    """
    threads = torch.get_num_threads()
    if tensor.device.type != "cpu" or threads == 1:
        yield 1
        return
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


def _map_chunks(fn: Callable[[slice], _T], chunks: list[slice], workers: int) -> list[_T]:
    """``[fn(c) for c in chunks]``, on ``workers`` Python threads when there are several."""
    if workers <= 1 or len(chunks) <= 1:
        return [fn(c) for c in chunks]
    with ThreadPoolExecutor(min(workers, len(chunks))) as pool:
        return list(pool.map(fn, chunks))
