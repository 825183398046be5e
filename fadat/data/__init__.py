"""Corpora, sentencepiece, binarized datasets and batching. The data contract is in
:mod:`fadat.data.contract`."""

from __future__ import annotations

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Batch, graph_size, make_batch

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Batch", "graph_size", "make_batch"]
