"""The DAG math of DA-Transformer and FA-DAT: pure functions on tensors, no module state.

A graph of ``L_b`` vertices carries token distributions ``token_logprobs`` and transitions
``links``; a path starts at vertex 0, ends at vertex ``L_b − 1`` and visits strictly increasing
vertices (paper §2.2, docs/reference-behaviour.md, "DAG likelihood"). Conventions shared by every
function:

- ``token_logprobs``: ``(B, L, V)`` float, ``log P(token | vertex)``.
- ``links``: ``(B, L, L)`` float, ``log E[i, j]``; −inf where ``j ≤ i`` or ``j ≥ L_b``; every row
  ``i < L_b − 1`` log-sums to 0. Entries outside the valid triangle are ignored (masked here), so
  padding may hold anything finite or −inf.
- ``targets``: ``(B, T)`` int64, ``targets[b, :T_b]`` is the reference (the objectives pass
  ``<s> y </s>``, so ``T_b`` counts both; docs/reference-behaviour.md, "DAG likelihood" / "Fuzzy
  alignment loss"); entries beyond ``T_b`` are ignored.
- ``graph_lengths`` ``(B,)`` and ``target_lengths`` ``(B,)``: int64, ``1 ≤ L_b ≤ L``,
  ``1 ≤ T_b ≤ T``.

Everything works in float32 (training) and float64 (tests) and is device-agnostic; on CUDA it
equals the CPU float64 results (``tests/test_cuda.py``, passed on an H100). The likelihood (forward
and backward) and the best alignment also exist as Triton kernels
(:mod:`fadat.kernels.triton_dag`), chosen with the ``backend`` argument: ``"auto"`` runs them on
float32 CUDA tensors where ``triton`` is installed (``AUTO_USES_TRITON``), this PyTorch path
everywhere else.

One module per idea: :mod:`.links` (transitions, passing probabilities), :mod:`.likelihood`
(the vertex-token match, log P(y|x) with its backward, log P(y|x) of decoded outputs),
:mod:`.alignment` (best alignment), :mod:`.fuzzy` (fuzzy alignment), :mod:`._shared` (checks,
masks and the chunked execution they share). This package exports the public names of all.
"""

from __future__ import annotations

from fadat.dag.alignment import best_alignment, best_alignment_from_match
from fadat.dag.fuzzy import FuzzyAlignment, fuzzy_alignment, reference_ngrams
from fadat.dag.likelihood import (
    LikelihoodStats,
    bos_eos_targets,
    dag_log_likelihood,
    dag_log_likelihood_from_match,
    gather_match,
    outputs_log_prob,
)
from fadat.dag.links import passing_probabilities

__all__ = [
    "FuzzyAlignment",
    "LikelihoodStats",
    "best_alignment",
    "best_alignment_from_match",
    "bos_eos_targets",
    "dag_log_likelihood",
    "dag_log_likelihood_from_match",
    "fuzzy_alignment",
    "gather_match",
    "outputs_log_prob",
    "passing_probabilities",
    "reference_ngrams",
]
