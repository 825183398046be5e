"""fadat: Directed Acyclic Transformers for non-autoregressive machine translation, trained with
the NLL of the DAG (DA-Transformer, Huang et al. 2022) and the fuzzy alignment objective (FA-DAT,
Ma et al. 2023), in plain PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"

import os
import sys
from typing import TYPE_CHECKING

# Transparent huge pages for torch's large CPU allocations (read once by torch, at its first
# allocation: effective when fadat is imported before torch, as by the `fadat` command). The
# dense (B, L, V) tensors of every training step are fresh allocations, and their 4 KiB page
# faults dominate: zero-filling a (64, 240, 8000) float32 gradient took 218 ms with 4 KiB pages
# and 52 ms with huge pages on the development machine (bench/bench_dag.py). Set
# THP_MEM_ALLOC_ENABLE=0 in the environment to keep 4 KiB pages.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def _keep_freed_memory() -> bool:
    """Let glibc's malloc reuse freed blocks below 32 MiB instead of unmapping them.

    With huge pages on, torch allocates every tensor of 2 MiB or more with a 2 MiB alignment,
    which glibc serves by a fresh mmap and unmaps on free: each such temporary (a (B, L, L)
    transition matrix, a (B, T, L) message table) is page-faulted anew at every use. A fixed
    mmap threshold of 32 MiB (glibc's maximum) keeps those blocks in the heap for reuse, and a
    256 MiB trim threshold keeps the heap from shrinking after every step. Measured on the
    development machine (bench/bench_dag.py, B = 64, L = 240, one thread): the DAG likelihood's
    forward + backward 333 -> 214 ms, a fresh (16, 240, 240) negation 1.26 -> 0.17 ms. Larger
    tensors (the (B, L, V) ones) still get fresh huge-page mappings. Linux/glibc only; set
    FADAT_MALLOC_TUNING=0 to leave malloc alone. Returns whether the settings were applied.
    """
    if os.environ.get("FADAT_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 * 2**20)) and bool(
        mallopt(m_trim_threshold, 256 * 2**20)
    )


MALLOC_TUNED = _keep_freed_memory()

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time see __getattr__
    from fadat.translate import Translator as Translator


def __getattr__(name: str):
    # Lazy export: `import fadat` stays light (no torch import) until Translator is used.
    if name == "Translator":
        from fadat.translate import Translator

        return Translator
    raise AttributeError(f"module 'fadat' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "Translator"])
