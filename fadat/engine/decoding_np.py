"""The DAT decoders that read each vertex's best token only (greedy, lookahead without n-gram
bans, Viterbi, joint-Viterbi), in numpy: the reference next to :mod:`fadat.decoding` for a
runtime without torch (:mod:`fadat.engine.runtime`).

The inputs are what the exported graph gives (:mod:`fadat.translation.onnx_export`):

- ``s``: ``(B, L)`` float, ``s_v = max_y log P(y|v)``;
- ``tok``: ``(B, L)`` int64, the argmax token of every vertex;
- ``links``: ``(B, L, L)`` float, ``log E[i, j]`` (−inf where ``j ≤ i`` or ``j ≥ L_b``; row
  ``L_b − 1`` and padding rows all −inf);
- ``graph_lengths``: ``(B,)`` int64 graph sizes ``L_b`` in ``[2, L]``.

Each decoder follows its torch twin step by step (:func:`fadat.decoding.greedy`,
:func:`~fadat.decoding.lookahead`, :func:`~fadat.decoding.viterbi`,
:func:`~fadat.decoding.joint_viterbi`, on a :class:`fadat.decoding.VertexTop1`): the same
arithmetic in the inputs' dtype (float16 is computed in float32, float64 stays float64), the
first index on ties, the same fallbacks. The paths and tokens are therefore the same; the
scores agree up to the order of float summation (tests/test_engine_decoding.py). The
conventions (paths, outputs, scores) are :mod:`fadat.decoding`'s.

This module imports numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

#: ``<pad>``'s id in fadat's special-token contract (``fadat.data.contract.PAD_ID``; repeated
#: here because that module needs torch; tests/test_engine_decoding.py checks they agree).
PAD_ID = 1


@dataclass(frozen=True)
class Hypothesis:
    """One decoded sentence, as :class:`fadat.decoding.Hypothesis`.

    Attributes:
        tokens: output token ids (endpoints dropped, consecutive duplicates removed, pad dropped).
        path: vertex ids from 0 to ``L_b − 1``, strictly increasing.
        path_tokens: the token id read at each vertex of ``path``.
        score: ``log P(path|x) + Σ_v s_v`` over the path's vertices, in nats.
    """

    tokens: list[int]
    path: list[int]
    path_tokens: list[int]
    score: float


def output_tokens(path_tokens: Sequence[int], pad_id: int = PAD_ID) -> list[int]:
    """The output sentence of a path's tokens (docs/reference-behaviour.md, post-processing):
    drop the endpoints' tokens, skip every token equal to the previous vertex's, drop ``<pad>``
    (``a a b`` → ``a b``, ``a <pad> a`` → ``a a``). The one implementation:
    :func:`fadat.decoding.output_tokens` calls it."""
    out: list[int] = []
    prev: int | None = None
    for t in list(path_tokens)[1:-1]:
        if t != prev and t != pad_id:
            out.append(int(t))
        prev = t
    return out


def path_score(
    token_logprobs: np.ndarray,
    links: np.ndarray,
    path: Sequence[int],
    path_tokens: Sequence[int],
) -> float:
    """``log P(a|x) + Σ_v log P(path_token_v | v)`` of one sentence's path, summed in float64
    (the one implementation: :func:`fadat.decoding.path_score` calls it).

    Args:
        token_logprobs: ``(L, V)`` log-probabilities of one sentence, or any ``(L, n)`` table
            whose column ``path_tokens[k]`` holds vertex ``path[k]``'s token (the beam search
            passes each vertex's top tokens and the columns of the path's tokens).
        links: ``(L, L)`` log transition probabilities of one sentence.
        path: vertex ids of the path.
        path_tokens: the columns of ``token_logprobs`` read at the path's vertices.

    Returns:
        The score in nats (−inf if the path uses a missing edge).
    """
    lp, ln = np.asarray(token_logprobs), np.asarray(links)
    p = np.asarray(path, dtype=np.int64)
    t = np.asarray(path_tokens, dtype=np.int64)
    return float(ln[p[:-1], p[1:]].astype(np.float64).sum() + lp[p, t].astype(np.float64).sum())


def _working(x: np.ndarray) -> np.ndarray:
    """float16 as float32 (sums of ~100 half-precision log-probs lose too much); others stay."""
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype == np.float16 else x


def check_inputs(s: np.ndarray, tok: np.ndarray, links: np.ndarray, graph_lengths: np.ndarray):
    """Check the decoders' inputs (module docstring).

    Raises:
        ValueError: a shape, dtype or length that breaks the contract.
    """
    if s.ndim != 2:
        raise ValueError(f"s must be (B, L), got shape {s.shape}")
    B, L = s.shape
    if tok.shape != (B, L):
        raise ValueError(f"tok must be (B, L) = {(B, L)}, got {tok.shape}")
    if links.shape != (B, L, L):
        raise ValueError(f"links must be (B, L, L) = {(B, L, L)}, got {links.shape}")
    if graph_lengths.shape != (B,) or not np.issubdtype(graph_lengths.dtype, np.integer):
        raise ValueError(f"graph_lengths must be (B,) = ({B},) integers, got {graph_lengths.shape}")
    if B and (int(graph_lengths.min()) < 2 or int(graph_lengths.max()) > L):
        raise ValueError(f"graph lengths must lie in [2, {L}], got {graph_lengths.tolist()}")


def _walk(next_vertex: np.ndarray, graph_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Follow ``next_vertex`` ``(B, L)`` from vertex 0 to ``L_b − 1`` for the whole batch:
    ``(paths (B, K), lengths (B,))`` int64, rows repeating their end vertex once reached.

    Raises:
        ValueError: a successor does not move forward (a row of links without valid entries).
    """
    B, L = next_vertex.shape
    end = graph_lengths.astype(np.int64) - 1  # (B,)
    cur = np.zeros(B, dtype=np.int64)  # (B,)
    done = cur == end
    steps = [cur]
    rows = np.arange(B)
    for _ in range(L):
        if done.all():
            break
        nxt = next_vertex[rows, cur]  # (B,)
        if ((nxt <= cur) & ~done).any():
            raise ValueError("links has a row without a valid successor before the end vertex")
        cur = np.where(done, cur, nxt)
        steps.append(cur)
        done = cur == end
    paths = np.stack(steps, 1)  # (B, K)
    lengths = (paths != end[:, None]).sum(1) + 1  # (B,) the end vertex counted once
    return paths, lengths


def _hypotheses(
    s: np.ndarray,
    tok: np.ndarray,
    links: np.ndarray,
    paths: np.ndarray,
    lengths: np.ndarray,
    output_rule: Callable[[Sequence[int]], list[int]] = output_tokens,
) -> list[Hypothesis]:
    """One :class:`Hypothesis` per row of the padded ``paths`` ``(B, K)`` (valid up to
    ``lengths`` ``(B,)``), scored as :func:`fadat.decoding.paths.hypotheses_from_paths`."""
    B, K = paths.shape
    rows = np.arange(B)[:, None]
    steps = np.arange(K)
    on_path = steps[None, :] < lengths[:, None]  # (B, K)
    has_edge = steps[None, 1:] < lengths[:, None]  # (B, K-1)
    safe = np.minimum(paths, links.shape[1] - 1)  # (B, K)
    edge_lp = links[rows, safe[:, :-1], safe[:, 1:]]  # (B, K-1)
    vert_lp = s[rows, safe]  # (B, K)
    zero = np.zeros((), dtype=edge_lp.dtype)
    score = np.where(has_edge, edge_lp, zero).sum(1) + np.where(on_path, vert_lp, zero).sum(1)
    path_tokens = tok[rows, safe]  # (B, K)
    out = []
    for p, t, n, sc in zip(
        paths.tolist(), path_tokens.tolist(), lengths.tolist(), score.tolist(), strict=True
    ):
        out.append(Hypothesis(output_rule(t[:n]), p[:n], t[:n], float(sc)))
    return out


def _lookahead_like(
    s: np.ndarray, tok: np.ndarray, links: np.ndarray, graph_lengths: np.ndarray, beta
) -> list[Hypothesis]:
    s, links, tok = _working(s), _working(links), np.asarray(tok)
    graph_lengths = np.asarray(graph_lengths)
    check_inputs(s, tok, links, graph_lengths)
    # β = 0 reads no s (0·(−inf) of a pruned vertex would be NaN), as fadat.decoding
    scores = links if not beta else links + np.asarray(beta, dtype=s.dtype) * s[:, None, :]
    next_vertex = scores.argmax(axis=2)  # (B, L): the first maximum, as torch's argmax
    paths, lengths = _walk(next_vertex, graph_lengths)  # (B, K), (B,)
    return _hypotheses(s, tok, links, paths, lengths)


def greedy(
    s: np.ndarray, tok: np.ndarray, links: np.ndarray, graph_lengths: np.ndarray
) -> list[Hypothesis]:
    """Greedy decoding (paper Eq. 21): from vertex 0, ``next = argmax_j links[i, j]`` until the
    end vertex; every path vertex reads its argmax token (:func:`fadat.decoding.greedy`).

    Args:
        s: ``(B, L)`` float. tok: ``(B, L)`` int64. links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.

    Returns:
        ``B`` hypotheses.

    Raises:
        ValueError: inputs that break the contract (:func:`check_inputs`).
    """
    return _lookahead_like(s, tok, links, graph_lengths, beta=None)


def lookahead(
    s: np.ndarray,
    tok: np.ndarray,
    links: np.ndarray,
    graph_lengths: np.ndarray,
    *,
    beta: float = 1.0,
) -> list[Hypothesis]:
    """Lookahead decoding without n-gram bans (paper Eq. 22): ``next = argmax_j (links[i, j] +
    β·s_j)`` (:func:`fadat.decoding.lookahead`).

    Args:
        s, tok, links, graph_lengths: as :func:`greedy`.
        beta: β ≥ 0, weight of the token score.

    Returns:
        ``B`` hypotheses.

    Raises:
        ValueError: inputs that break the contract.
    """
    return _lookahead_like(s, tok, links, graph_lengths, beta=beta)


def _viterbi(
    s: np.ndarray,
    tok: np.ndarray,
    links: np.ndarray,
    graph_lengths: np.ndarray,
    joint: bool,
    length_penalty: float,
    max_length: int | None,
) -> list[Hypothesis]:
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    s, links, tok = _working(s), _working(links), np.asarray(tok)
    graph_lengths = np.asarray(graph_lengths)
    check_inputs(s, tok, links, graph_lengths)
    B, L, _ = links.shape
    end = graph_lengths.astype(np.int64) - 1  # (B,)
    vertex = np.arange(L)
    intermediate = (vertex[None, :] >= 1) & (vertex[None, :] < end[:, None])  # (B, L)
    emit = s if joint else np.zeros_like(s)  # (B, L)
    emit = np.where(intermediate, emit, np.asarray(-np.inf, dtype=s.dtype))  # (B, L)
    to_end = links[np.arange(B)[:, None], vertex[None, :], end[:, None]]  # (B, L) links[j, end]

    K = max(int(end.max()) - 1, 0) if B else 0
    if max_length is not None:
        K = min(K, max_length)
    links_t = np.ascontiguousarray(links.transpose(0, 2, 1))  # (B, L, L) [b, j, i]
    a = links[:, 0, 1:] + emit[:, 1:]  # (B, L-1): a_1[j], j ≥ 1
    if joint:
        a = a + s[:, :1]  # the start vertex's s_0, as fadat.decoding.joint_viterbi
    ends_val, ends_arg = [], []
    backptr: list[np.ndarray] = []  # backptr[k-2][b, j - k]: predecessor of j, k vertices
    for k in range(1, K + 1):
        if k > 1:
            block = a[:, None, :-1] + links_t[:, k:, k - 1 : L - 1]  # (B, L-k, L-k) [b, j, i]
            arg = block.argmax(axis=2)  # (B, L-k): the first maximum
            val = np.take_along_axis(block, arg[..., None], axis=2)[..., 0]  # (B, L-k)
            a = val + emit[:, k:]  # (B, L-k)
            backptr.append(arg)
        total = a + to_end[:, k:]  # (B, L-k)
        arg = total.argmax(axis=1)  # (B,)
        ends_val.append(total[np.arange(B), arg])
        ends_arg.append(arg + k)
    best_l = [-np.inf] * B
    k_l = j_l = [0] * B
    if K:
        ks = np.arange(1, K + 1, dtype=links.dtype)  # (K,)
        norm = np.stack(ends_val) / ks[:, None] ** np.asarray(length_penalty, links.dtype)
        best_k = norm.argmax(axis=0)  # (B,): ties keep the smallest k
        best = norm[best_k, np.arange(B)]
        best_j = np.stack(ends_arg)[best_k, np.arange(B)]  # (B,)
        best_l, k_l, j_l = best.tolist(), (best_k + 1).tolist(), best_j.tolist()

    end_l = end.tolist()
    paths = []
    for b in range(B):
        if best_l[b] == -np.inf:
            paths.append([0, end_l[b]])  # no path with 1 ≤ k ≤ K: the direct edge (or L_b = 2)
            continue
        rev, j = [end_l[b]], j_l[b]
        for k in range(k_l[b], 0, -1):
            rev.append(j)
            if k > 1:
                j = int(backptr[k - 2][b, j - k]) + (k - 1)
        rev.append(0)
        paths.append(rev[::-1])
    width = max((len(p) for p in paths), default=0)
    padded = np.array([p + [p[-1]] * (width - len(p)) for p in paths], dtype=np.int64)
    padded = padded.reshape(B, width)  # (B, K)
    lengths = np.array([len(p) for p in paths], dtype=np.int64)  # (B,)
    return _hypotheses(s, tok, links, padded, lengths)


def viterbi(
    s: np.ndarray,
    tok: np.ndarray,
    links: np.ndarray,
    graph_lengths: np.ndarray,
    *,
    length_penalty: float = 1.0,
    max_length: int | None = None,
) -> list[Hypothesis]:
    """Length-normalised best path: maximises ``(Σ_edges links) / k^β_v`` over paths with
    ``1 ≤ k (≤ max_length)`` intermediate vertices (:func:`fadat.decoding.viterbi`: the same DP,
    fallbacks and 2-vertex rule).

    Args:
        s, tok, links, graph_lengths: as :func:`greedy`.
        length_penalty: β_v. max_length: optional upper bound on ``k``.

    Returns:
        ``B`` hypotheses.

    Raises:
        ValueError: ``max_length < 1``, or inputs that break the contract.
    """
    return _viterbi(s, tok, links, graph_lengths, False, length_penalty, max_length)


def joint_viterbi(
    s: np.ndarray,
    tok: np.ndarray,
    links: np.ndarray,
    graph_lengths: np.ndarray,
    *,
    length_penalty: float = 1.0,
    max_length: int | None = None,
) -> list[Hypothesis]:
    """Joint-Viterbi: maximises ``(s_0 + Σ_{intermediate v} s_v + Σ_edges links) / k^β_v``
    (:func:`fadat.decoding.joint_viterbi`).

    Args:
        s, tok, links, graph_lengths: as :func:`greedy`.
        length_penalty: β_v. max_length: optional upper bound on ``k``.

    Returns:
        ``B`` hypotheses.

    Raises:
        ValueError: ``max_length < 1``, or inputs that break the contract.
    """
    return _viterbi(s, tok, links, graph_lengths, True, length_penalty, max_length)


#: Strategy name → numpy decoder ``fn(s, tok, links, graph_lengths, **options)``: the
#: DAG strategies that read each vertex's best token only (:mod:`fadat.decoding.strategies`).
STRATEGIES: dict[str, Callable[..., list[Hypothesis]]] = {
    "greedy": greedy,
    "lookahead": lookahead,
    "viterbi": viterbi,
    "joint-viterbi": joint_viterbi,
}


def decode(
    s: np.ndarray,
    tok: np.ndarray,
    links: np.ndarray,
    graph_lengths: np.ndarray,
    strategy: str,
    **options,
) -> list[Hypothesis]:
    """Decode a batch with one of :data:`STRATEGIES` (options as :func:`fadat.decoding.decode`
    takes them; lookahead's n-gram bans read more than ``s``/``tok`` and are not offered).

    Raises:
        ValueError: unknown strategy or option, bad option value, inputs that break the
            contract.
    """
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise ValueError(
            f"strategy {strategy!r} is not available in the numpy engine; "
            f"choose one of {', '.join(STRATEGIES)}"
        )
    try:
        return fn(s, tok, links, graph_lengths, **options)
    except TypeError as err:
        raise ValueError(f"strategy {strategy!r}: {err}") from err
