"""What every decoder of :mod:`fadat.decoding` shares: the :class:`Hypothesis` it returns, the
per-vertex best tokens (:class:`VertexTop1`, :func:`vertex_top1`), the output of a path
(:func:`output_tokens`) and its score (:func:`path_score`), the input checks, and the batched
construction of hypotheses from vertex paths. Conventions: :mod:`fadat.decoding`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from fadat.data.contract import PAD_ID
from fadat.engine.decoding_np import output_tokens as _output_tokens
from fadat.engine.decoding_np import path_score as _path_score

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Hypothesis:
    """One decoded sentence.

    Attributes:
        tokens: output token ids (endpoints dropped, consecutive duplicates removed, pad dropped).
        path: vertex ids from 0 to ``L_b − 1``, strictly increasing.
        path_tokens: the token id read at each vertex of ``path`` (same length as ``path``).
        score: ``log P(path|x) + Σ_v log P(path_token_v | v)`` in nats.
    """

    tokens: list[int]
    path: list[int]
    path_tokens: list[int]
    score: float


class VertexTop1(NamedTuple):
    """The token head reduced to what greedy, lookahead without n-gram bans, Viterbi and
    joint-Viterbi read (``Strategy.top1`` of :mod:`fadat.decoding.strategies`): every vertex's
    best token and its log-probability. :func:`decode` accepts it in place of
    ``token_logprobs``, so a model can skip the ``(B, L, V)`` log-probabilities (fadat.inference).

    Attributes:
        s: ``(B, L)`` float, ``s_v = max_y log P(y|v)``.
        tok: ``(B, L)`` int64, the argmax token of every vertex.
    """

    s: torch.Tensor
    tok: torch.Tensor


# ----------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------


def vertex_top1(token_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Best token of every vertex: ``s_v = max_y log P(y|v)`` and its id.

    Args:
        token_logprobs: ``(B, L, V)`` float log-probabilities.

    Returns:
        ``(s, tok)``: ``(B, L)`` float ``s_v`` and ``(B, L)`` int64 argmax token ids (the lowest
        id on ties).
    """
    if isinstance(token_logprobs, VertexTop1):
        return token_logprobs.s, token_logprobs.tok
    s, tok = token_logprobs.max(dim=-1)  # (B, L), (B, L)
    return s, tok


def output_tokens(path_tokens: Sequence[int]) -> list[int]:
    """The output sentence of a path's tokens (docs/reference-behaviour.md, post-processing).

    Drops the first and last token (the endpoints), then skips every token equal to the previous
    vertex's token (consecutive de-duplication on the raw sequence), then drops ``<pad>``. So
    ``a a b`` → ``a b`` and ``a <pad> a`` → ``a a``. One implementation for both engines:
    :func:`fadat.engine.decoding_np.output_tokens` (importable without torch).

    Args:
        path_tokens: token ids at the vertices of a path, endpoints included.

    Returns:
        The output token ids.
    """
    return _output_tokens(path_tokens, PAD_ID)


def path_score(
    token_logprobs: torch.Tensor | np.ndarray,
    links: torch.Tensor | np.ndarray,
    path: Sequence[int],
    path_tokens: Sequence[int],
) -> float:
    """``log P(a|x) + Σ_v log P(path_token_v | v)`` of one sentence's path (the Hypothesis score).

    Args:
        token_logprobs: ``(L, V)`` log-probabilities of one sentence.
        links: ``(L, L)`` log transition probabilities of one sentence.
        path: vertex ids of the path.
        path_tokens: token ids at the path's vertices.

    Returns:
        The score in nats (−inf if the path uses a missing edge), summed in float64 by
        :func:`fadat.engine.decoding_np.path_score` (the one implementation).
    """
    lp = np.asarray(
        token_logprobs.detach().cpu() if torch.is_tensor(token_logprobs) else token_logprobs
    )
    ln = np.asarray(links.detach().cpu() if torch.is_tensor(links) else links)
    return _path_score(lp, ln, path, path_tokens)


def check_inputs(
    token_logprobs: torch.Tensor, links: torch.Tensor, graph_lengths: torch.Tensor
) -> None:
    """Check the decoders' inputs (module docstring of :mod:`fadat.decoding`): ``(B, L, V)``
    token log-probabilities or their :class:`VertexTop1`, ``(B, L, L)`` links, ``(B,)`` integer
    graph lengths in ``[2, L]``.

    Raises:
        ValueError: a shape, dtype or length that breaks the contract.
    """
    if isinstance(token_logprobs, VertexTop1):
        token_logprobs = token_logprobs.s[..., None]  # (B, L, 1): the shapes to check
    if token_logprobs.dim() != 3:
        raise ValueError(
            f"token_logprobs must be (B, L, V), got shape {tuple(token_logprobs.shape)}"
        )
    B, L, _ = token_logprobs.shape
    if tuple(links.shape) != (B, L, L):
        raise ValueError(f"links must be (B, L, L) = {(B, L, L)}, got {tuple(links.shape)}")
    if tuple(graph_lengths.shape) != (B,):
        raise ValueError(f"graph_lengths must be (B,) = ({B},), got {tuple(graph_lengths.shape)}")
    if graph_lengths.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"graph_lengths must be an integer tensor, got {graph_lengths.dtype}")
    if B and (int(graph_lengths.min()) < 2 or int(graph_lengths.max()) > L):
        raise ValueError(f"graph lengths must lie in [2, {L}], got {graph_lengths.tolist()}")


def working_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` (a tensor or :class:`VertexTop1`) in the dtype the decoders compute in: float16 and
    bfloat16 become float32, other dtypes stay."""
    # Half precision sums of ~100 log-probabilities lose too much; float64 input stays float64.
    if isinstance(x, VertexTop1):
        return VertexTop1(working_dtype(x.s), x.tok)
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def hypotheses_from_paths(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    paths: torch.Tensor,
    path_tokens: torch.Tensor,
    path_lengths: torch.Tensor,
    output_rule: Callable[[Sequence[int]], list[int]] = output_tokens,
) -> list[Hypothesis]:
    """Batched scores of padded paths, then one :class:`Hypothesis` per row.

    ``paths``/``path_tokens``: ``(B, K)`` int64, valid up to ``path_lengths`` ``(B,)``;
    ``output_rule`` turns a path's tokens into the output (:func:`output_tokens` by default).
    """
    B, K = paths.shape
    steps = torch.arange(K, device=paths.device)  # (K,)
    on_path = steps[None, :] < path_lengths[:, None]  # (B, K)
    has_edge = steps[None, 1:] < path_lengths[:, None]  # (B, K-1)
    safe = paths.clamp(max=links.shape[1] - 1)
    edge_idx = safe[:, :-1] * links.shape[2] + safe[:, 1:]  # (B, K-1) flat index into (L, L)
    edge_lp = links.reshape(B, -1).gather(1, edge_idx)  # (B, K-1)
    if isinstance(token_logprobs, VertexTop1):  # the path tokens are the argmax tokens
        vert_lp = token_logprobs.s.gather(1, safe)  # (B, K)
    else:
        vert_idx = safe * token_logprobs.shape[2] + path_tokens  # (B, K) flat index into (L, V)
        vert_lp = token_logprobs.reshape(B, -1).gather(1, vert_idx)  # (B, K)
    zero = torch.zeros((), dtype=edge_lp.dtype, device=edge_lp.device)
    score = torch.where(has_edge, edge_lp, zero).sum(1) + torch.where(on_path, vert_lp, zero).sum(1)
    out = []
    for p, t, n, s in zip(
        paths.tolist(), path_tokens.tolist(), path_lengths.tolist(), score.tolist(), strict=True
    ):
        out.append(Hypothesis(output_rule(t[:n]), p[:n], t[:n], float(s)))
    return out
