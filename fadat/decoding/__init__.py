"""Decoders that read a translation off a DAG (paper §3 Eq. 21-22; docs/reference-behaviour.md).

Every decoder consumes the model's two outputs and nothing else:

- ``token_logprobs``: ``(B, L, V)`` float, ``log P(token | vertex)``;
- ``links``: ``(B, L, L)`` float, ``log E[i, j]`` (−inf where ``j ≤ i`` or ``j ≥ L_b``; every row
  ``i < L_b − 1`` log-sums to 0; row ``L_b − 1`` and padding rows are all −inf);
- ``graph_lengths``: ``(B,)`` int64 graph sizes ``L_b``.

A path starts at vertex 0, ends at vertex ``L_b − 1`` and visits strictly increasing vertices.
Each decoder returns one :class:`Hypothesis` per sentence:

- ``path``: the vertex sequence ``0 … L_b − 1``;
- ``path_tokens``: the token read at every path vertex, endpoints included;
- ``tokens``: the output, :func:`output_tokens` of ``path_tokens``: the endpoints' tokens are
  dropped, then consecutive duplicates are removed (a token equal to the previous *vertex's*
  token is skipped), then ``<pad>`` ids are dropped (the reference skips a vertex's token if it
  equals the previously visited vertex's token or is pad; lookahead with n-gram bans is the
  exception: it keeps repeats, see :func:`lookahead`). Other special ids emitted at intermediate
  vertices are kept. Unlike the reference, which de-duplicates the whole sequence and strips
  ``<s>``/``</s>`` afterwards, the endpoints are removed first, so an intermediate ``<s>`` right
  after the start vertex is kept;
- ``score``: ``log P(a|x) + Σ_{v ∈ a} log P(path_token_v | v)`` (natural log), i.e. the sum of
  the path's links plus the log-probability of every path token, endpoints included.

Strategies: ``greedy``, ``lookahead``, ``viterbi``, ``joint-viterbi``, ``sample``, ``beam``, one
record each in :mod:`.strategies` (its function, options, what it reads, whether it gives n-best;
the registry :data:`REGISTRY` holds the AT's and the argmax's records too); :func:`decode`
dispatches by name. ``s_v = max_y log P(y|v)`` and the argmax token come from :func:`vertex_top1`.

Greedy, lookahead, Viterbi and the candidate tables of sampling are batched tensor code and run
on the device of the inputs (CUDA was not run: this machine has no GPU). Beam search is a
per-sentence search on the CPU compiled with numba, as the reference's (C++/OpenMP) one is
compiled; :func:`beam_search_candidates` runs it from each vertex's top tokens alone. Its
optional n-gram language model needs the ``kenlm`` package (not a core dependency).

One module per family: :mod:`.paths` (what every decoder shares: :class:`Hypothesis`, outputs
and scores of paths, input checks), :mod:`.greedy` (greedy, lookahead), :mod:`.viterbi`
(Viterbi, joint-Viterbi), :mod:`.sampling` (candidate tables, n-gram bans, sampling),
:mod:`.beam` (beam search); the records and the registry are in :mod:`.strategies`, the
dispatcher is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fadat.decoding.beam import beam_search, beam_search_candidates
from fadat.decoding.greedy import greedy, lookahead, walk_links
from fadat.decoding.paths import (
    Hypothesis,
    VertexTop1,
    check_inputs,
    output_tokens,
    path_score,
    vertex_top1,
)
from fadat.decoding.sampling import BANNED_WEIGHT, sample
from fadat.decoding.strategies import (
    GRAPH,
    REGISTRY,
    Strategy,
    StrategyError,
    StrategyOption,
    offered,
    strategy_names,
)
from fadat.decoding.viterbi import joint_viterbi, viterbi

__all__ = [
    "BANNED_WEIGHT",
    "REGISTRY",
    "STRATEGIES",
    "Hypothesis",
    "Strategy",
    "StrategyError",
    "StrategyOption",
    "VertexTop1",
    "beam_search",
    "beam_search_candidates",
    "decode",
    "greedy",
    "joint_viterbi",
    "lookahead",
    "offered",
    "output_tokens",
    "path_score",
    "sample",
    "strategy_names",
    "vertex_top1",
    "viterbi",
    "walk_links",
]


#: DAG strategy name → decoder ``fn(token_logprobs, links, graph_lengths, **options)``: a view
#: of the :data:`REGISTRY` records that read a graph.
STRATEGIES: dict[str, Callable[..., list[Hypothesis]]] = {
    name: record.fn for name, record in offered(GRAPH).items()
}


def decode(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    strategy: str,
    **options: Any,
) -> list[Hypothesis]:
    """Decode a batch of DAGs with one of :data:`STRATEGIES`.

    Args:
        token_logprobs: ``(B, L, V)`` float log P(token|vertex), or their :class:`VertexTop1`
            for a strategy that reads only that (:meth:`Strategy.reads_top1_only`: greedy,
            lookahead without n-gram bans, Viterbi, joint-Viterbi).
        links: ``(B, L, L)`` float log E (see the module docstring for the layout).
        graph_lengths: ``(B,)`` int64 graph sizes, each in ``[2, L]``.
        strategy: ``greedy``, ``lookahead``, ``viterbi``, ``joint-viterbi``, ``sample`` or ``beam``.
        **options: the chosen decoder's keyword options.

    Returns:
        One :class:`Hypothesis` per sentence.

    Raises:
        ValueError: unknown strategy or option, bad option value, or inconsistent shapes.
    """
    record = offered(GRAPH).get(strategy)
    if record is None:
        raise ValueError(f"unknown decoding strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    accepted = record.option_names
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for strategy {strategy!r}; "
            f"accepted: {', '.join(accepted) or 'none'}"
        )
    if isinstance(token_logprobs, VertexTop1) and not record.reads_top1_only(options):
        raise ValueError(
            f"strategy {strategy!r} with these options reads more of the token head than "
            "VertexTop1 holds; pass the (B, L, V) token log-probabilities"
        )
    check_inputs(token_logprobs, links, graph_lengths)
    with torch.no_grad():
        return record.fn(token_logprobs, links, graph_lengths, **options)
