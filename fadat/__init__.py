"""fadat: Directed Acyclic Transformers for non-autoregressive machine translation, trained with
the NLL of the DAG (DA-Transformer, Huang et al. 2022) and the fuzzy alignment objective (FA-DAT,
Ma et al. 2023), in plain PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"

import os
from typing import TYPE_CHECKING

# Transparent huge pages for torch's large CPU allocations (read once by torch, at its first
# allocation: effective when fadat is imported before torch, as by the `fadat` command). The
# dense (B, L, V) tensors of every training step are fresh allocations, and their 4 KiB page
# faults dominate: zero-filling a (64, 240, 8000) float32 gradient took 218 ms with 4 KiB pages
# and 52 ms with huge pages on the development machine (bench/bench_dag.py). Set
# THP_MEM_ALLOC_ENABLE=0 in the environment to keep 4 KiB pages.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

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
