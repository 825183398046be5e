"""fadat: Directed Acyclic Transformers for non-autoregressive machine translation, trained with
the NLL of the DAG (DA-Transformer, Huang et al. 2022) and the fuzzy alignment objective (FA-DAT,
Ma et al. 2023), in plain PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"
