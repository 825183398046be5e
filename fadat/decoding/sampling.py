"""Sampling with n-gram bans (docs/reference-behaviour.md, sampling): the per-vertex candidate
tables, the ban state of consecutive and repeated n-grams, the candidate walk that sampling and
lookahead-with-bans share, and :func:`sample`. Conventions: :mod:`fadat.decoding`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fadat.data.contract import PAD_ID
from fadat.decoding.paths import (
    NEG_INF,
    Hypothesis,
    hypotheses_from_paths,
    output_tokens,
    vertex_top1,
    working_dtype,
)

#: Weight a banned candidate keeps in sampling, as in the reference
#: (docs/reference-behaviour.md, sampling), before renormalisation.
BANNED_WEIGHT = 1e-5

# Candidate-pair score tensors are built for at most this many (sentence, i, j, token) entries
# at once (64 MiB of float32).
_PAIR_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class CandidateTable:
    """The ``n`` best (vertex, token) continuations of every source vertex, from
    :func:`candidate_table`."""

    vertex: torch.Tensor  # (B, L, n) int64 destination vertex of each candidate
    token: torch.Tensor  # (B, L, n) int64 its token
    score: torch.Tensor  # (B, L, n) float log weight, descending; −inf = no candidate
    is_end: torch.Tensor  # (B, L, n) bool destination is the end vertex


def candidate_table(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    top_cand_n: int,
    beta: float,
    temperature: float,
    top_p: float | None,
    end_as_vertex: bool,
) -> CandidateTable:
    """Top ``top_cand_n`` (vertex, token) pairs per source vertex (docs/reference-behaviour.md,
    sampling and n-gram bans).

    Pair score: ``log_softmax_j(links[i] / τ)[j] + β·log P(y|j)`` for ``y`` among the top
    ``top_cand_n`` tokens of ``j``. With ``end_as_vertex`` the end vertex is a destination like
    any other (the reference's lookahead with bans); without, it is one pair with its argmax
    token, scored by the transition alone (sampling). With ``top_p``, a candidate is dropped
    (score −inf) once the ``exp(score)`` mass ranked before it reaches ``top_p``; the first
    candidate is always kept.
    """
    if top_cand_n < 1:
        raise ValueError(f"top_cand_n must be >= 1, got {top_cand_n}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    token_logprobs, links = working_dtype(token_logprobs), working_dtype(links)
    B, L, V = token_logprobs.shape
    device = links.device
    n_tok = min(top_cand_n, V)
    tok_lp, tok_id = token_logprobs.topk(n_tok, dim=2)  # (B, L, n_tok)
    trans = links
    if temperature != 1.0:
        has_row = torch.isfinite(links).any(dim=2, keepdim=True)  # (B, L, 1)
        trans = torch.where(has_row, torch.log_softmax(links / temperature, dim=2), links)
    end = graph_lengths.to(device) - 1  # (B,)
    is_end_v = torch.arange(L, device=device)[None, :] == end[:, None]  # (B, L)
    neg_inf = float("-inf")
    n = min(top_cand_n, L * n_tok)
    scores, flats = [], []
    # The (b, L, L, n_tok) pair scores are built a few sentences at a time to bound memory.
    chunk = max(1, _PAIR_CHUNK_ELEMENTS // (L * L * n_tok))
    for lo in range(0, B, chunk):
        sl = slice(lo, lo + chunk)
        pair = trans[sl, :, :, None] + beta * tok_lp[sl, None, :, :]  # (b, L, L, n_tok)
        if not end_as_vertex:
            # the end vertex's column: one candidate (its argmax token), scored by the transition
            rows = torch.arange(pair.shape[0], device=device)  # (b,)
            end_b = end[sl]  # (b,)
            pair[rows, :, end_b, 1:] = neg_inf
            pair[rows, :, end_b, 0] = trans[sl][rows, :, end_b]  # (b, L) links[i, end]
        sc, fl = pair.reshape(pair.shape[0], L, L * n_tok).topk(n, dim=2)  # (b, L, n)
        scores.append(sc)
        flats.append(fl)
    score, flat = torch.cat(scores), torch.cat(flats)  # (B, L, n)
    vertex = flat // n_tok  # (B, L, n) destination vertex; flat % n_tok is the token's rank
    token = tok_id.reshape(B, L * n_tok).gather(1, flat.reshape(B, -1)).reshape(B, L, n)
    if top_p is not None and top_p < 1.0:
        w = score.exp()  # (B, L, n)
        before = w.cumsum(2) - w  # (B, L, n) mass ranked before each candidate
        score = score.masked_fill(before >= top_p, NEG_INF)
    return CandidateTable(
        vertex, token, score, is_end_v.gather(1, vertex.reshape(B, -1)).reshape(B, L, n)
    )


def check_ban_options(consecutive: int, repeated: int) -> None:
    """Raises ValueError unless both n-gram ban orders are ``>= 0`` (0 = no ban)."""
    if consecutive < 0 or repeated < 0:
        raise ValueError("n-gram ban orders must be >= 0")


class _BanState:
    """One sentence's token history and its n-gram bans (docs/reference-behaviour.md, n-gram bans).

    Two histories, as the reference's two walks keep them:

    - ``chosen`` (lookahead): every token chosen so far, pads and repeats included, after the
      start vertex's token. The start token counts in the consecutive-repeat comparisons but is
      never banned itself and starts no banned n-gram (in the reference it is held as a tensor,
      which a candidate id never equals as a set member).
    - ``output`` (sampling): the output so far by the rule of :func:`output_tokens` (a token equal
      to the previous vertex's is skipped, pads are dropped).
    """

    def __init__(self, consecutive: int, repeated: int, start: int | None) -> None:
        self.hist: list[int] = [] if start is None else [start]
        self.offset = len(self.hist)  # history entries that are never banned nor in n-grams
        self.raw = start is not None
        self.prev: int | None = None  # the previous intermediate vertex's token (output rule)
        self.consecutive = consecutive
        self.repeated = repeated
        self.seen: set[tuple[int, ...]] = set()

    def banned(self, t: int) -> bool:
        h = self.hist
        if self.consecutive >= 1 and len(h) > self.offset and h[-1] == t:
            return True
        # t would make the last m tokens repeat the m before them
        for m in range(2, min(self.consecutive, (len(h) + 1) // 2) + 1):
            if h[-m] == t and all(h[-k] == h[-m - k] for k in range(1, m)):
                return True
        n = self.repeated
        body = h[self.offset :]
        return n > 0 and len(body) >= n - 1 and (*body[len(body) - n + 1 :], t) in self.seen

    def push(self, t: int) -> None:
        if not self.raw:
            prev, self.prev = self.prev, t
            if t == PAD_ID or t == prev:
                return
        self.hist.append(t)
        n = self.repeated
        if n > 0 and len(self.hist) - self.offset >= n:
            self.seen.add(tuple(self.hist[-n:]))


def _chosen_output(path_tokens: Sequence[int]) -> list[int]:
    """Output of a lookahead walk with bans: the intermediate tokens without pads, repeats kept."""
    return [int(t) for t in list(path_tokens)[1:-1] if t != PAD_ID]


def candidate_walk(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    table: CandidateTable,
    sample: bool,
    top_p: float,
    consecutive: int,
    repeated: int,
    rng: np.random.Generator | None,
) -> list[Hypothesis]:
    """Walk the candidate table from vertex 0 to the end, batched over sentences per step.

    Sampling keeps the ``output`` history of :class:`_BanState` and never bans the end vertex;
    lookahead (``sample=False``) keeps the ``chosen`` history, bans end-vertex candidates like
    any other and outputs every chosen intermediate token but pads (:func:`_chosen_output`), as
    the reference does. The walk runs in NumPy on the CPU: each step is a handful of tiny array
    operations, for which torch's per-call overhead would dominate.
    """
    B, L, n = table.score.shape
    vert = table.vertex.cpu().numpy()  # (B, L, n)
    tokt = table.token.cpu().numpy()  # (B, L, n)
    weight = table.score.cpu().to(torch.float64).exp().numpy()  # (B, L, n), 0 = no candidate
    is_end = table.is_end.cpu().numpy()  # (B, L, n)
    end = (graph_lengths.cpu() - 1).numpy().astype(np.int64)  # (B,)
    tok = vertex_top1(working_dtype(token_logprobs))[1].cpu().numpy()  # (B, L)
    bans = consecutive > 0 or repeated > 0
    states = []
    if bans:
        starts = [None] * B if sample else tok[:, 0].tolist()
        states = [_BanState(consecutive, repeated, start) for start in starts]
    never_banned = is_end if sample else np.zeros_like(is_end)  # (B, L, n)
    rows = np.arange(B)
    cur = np.zeros(B, dtype=np.int64)  # (B,)
    paths, ptoks = [cur.copy()], [tok[:, 0].copy()]
    done = cur == end
    for _ in range(L):
        if done.all():
            break
        w = weight[rows, cur].copy()  # (B, n)
        cand_t, cand_free = tokt[rows, cur], never_banned[rows, cur]  # (B, n), (B, n)
        active = np.flatnonzero(~done).tolist()
        if sample:
            choice = _draw_choice(w, cand_t, cand_free, done, active, states if bans else None, rng)
        else:
            choice = _lookahead_choice(w, cand_t, cand_free, active, states, top_p)
        nxt_v = vert[rows, cur, choice]  # (B,)
        nxt_t = tokt[rows, cur, choice]  # (B,)
        if ((nxt_v <= cur) & ~done).any():
            raise ValueError("links has a row without a valid successor before the end vertex")
        if bans:
            for b in active:
                if nxt_v[b] != end[b]:
                    states[b].push(int(nxt_t[b]))
        cur = np.where(done, cur, nxt_v)
        paths.append(cur.copy())
        ptoks.append(np.where(done, ptoks[-1], nxt_t))
        done = cur == end
    device = links.device
    path_t = torch.from_numpy(np.stack(paths, 1)).to(device)  # (B, K)
    tok_t = torch.from_numpy(np.stack(ptoks, 1)).to(device)  # (B, K)
    lengths = (path_t != torch.from_numpy(end).to(device)[:, None]).sum(1) + 1  # (B,)
    return hypotheses_from_paths(
        working_dtype(token_logprobs),
        working_dtype(links),
        path_t,
        tok_t,
        lengths,
        output_tokens if sample else _chosen_output,
    )


def _draw_choice(
    w: np.ndarray,
    cand_t: np.ndarray,
    cand_free: np.ndarray,
    done: np.ndarray,
    active: list[int],
    states: list[_BanState] | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """Sampling's step: draw one candidate ``(B,)`` of the current vertices by weight ``w``
    ``(B, n)`` (modified in place), banned candidates (``states`` given) down-weighted to
    :data:`BANNED_WEIGHT`; finished sentences take candidate 0. One ``rng.random(B)`` call."""
    B, n = w.shape
    if states is not None:
        for b in active:
            for c in range(n):
                if w[b, c] > 0 and not cand_free[b, c] and states[b].banned(int(cand_t[b, c])):
                    w[b, c] = BANNED_WEIGHT
    w[done] = 0.0
    w[done, 0] = 1.0
    cdf = np.cumsum(w, axis=1)  # (B, n)
    u = rng.random(B) * cdf[:, -1]  # (B,)
    choice = np.minimum((cdf <= u[:, None]).sum(1), n - 1)  # (B,) inverse CDF
    # u rounded up to the total could land on a trailing zero weight: never draw it
    return np.where(w[np.arange(B), choice] > 0, choice, 0)


def _lookahead_choice(
    w: np.ndarray,
    cand_t: np.ndarray,
    cand_free: np.ndarray,
    active: list[int],
    states: list[_BanState],
    top_p: float,
) -> np.ndarray:
    """Lookahead's step with bans: each active sentence's best candidate ``(B,)`` that is not
    banned, or the top one (0) once the weight of the banned ones skipped exceeds ``top_p``."""
    B, n = w.shape
    choice = np.zeros(B, dtype=np.int64)
    for b in active:
        skipped = 0.0
        for c in range(n):
            if w[b, c] <= 0:
                break  # candidates are sorted: the rest are missing too
            if cand_free[b, c] or not states[b].banned(int(cand_t[b, c])):
                choice[b] = c
                break
            skipped += w[b, c]
            if skipped > top_p:
                break  # too much mass skipped: fall back to the top candidate
    return choice


def sample(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    *,
    temperature: float = 1.0,
    beta: float = 1.0,
    top_cand_n: int = 5,
    top_p: float = 0.9,
    seed: int | None = None,
    no_consecutive_repeated_ngram: int = 1,
    no_repeated_ngram: int = 0,
) -> list[Hypothesis]:
    """Random walk over (vertex, token) candidates (docs/reference-behaviour.md, sampling).

    At vertex ``i``, candidate pairs ``(j, y)`` are scored
    ``log_softmax_j(links[i] / τ)[j] + β·log P(y|j)`` (``y`` among the top ``top_cand_n`` tokens
    of ``j``); the top ``top_cand_n`` pairs are kept in descending order and truncated once the
    ``exp(score)`` mass ranked before a candidate reaches ``top_p`` (the first always stays).
    Banned candidates get weight :data:`BANNED_WEIGHT` instead of ``exp(score)``; the weights are
    renormalised and one pair is drawn; the walk starts at vertex 0 and stops at the end vertex.

    Bans (on the output so far, see :func:`output_tokens`): ``no_consecutive_repeated_ngram = k``
    bans tokens that would make the last ``m`` output tokens repeat the ``m`` before them for
    ``1 ≤ m ≤ k``; its default 1 bans the previous token, which the reference always does in
    sampling (0 switches it off). ``no_repeated_ngram = n > 0`` bans tokens completing an
    ``n``-gram already in the output.

    Deviation: the end vertex is one candidate whose weight is the transition alone (its token,
    the argmax, is never output), so with ``τ = 1``, ``top_p = 1``, no bans and enough candidates
    a path is drawn with probability exactly ``P(a|x)``.

    The candidate tables are computed batched on the inputs' device; the walk runs on the CPU,
    batched over sentences per step (ban checks loop over sentences). Draws use
    ``numpy.random.default_rng(seed)`` (fresh entropy if ``seed`` is None) and consume one
    uniform per sentence per step, so results are reproducible for a fixed seed and batch, but a
    sentence's draw depends on the batch it is in.

    Args:
        token_logprobs: ``(B, L, V)`` float.
        links: ``(B, L, L)`` float.
        graph_lengths: ``(B,)`` int64.
        temperature: τ > 0 applied to the transitions.
        beta: β, weight of the token log-probability.
        top_cand_n: candidates per source vertex (≥ 1).
        top_p: nucleus mass in (0, 1]; 1 keeps all candidates.
        seed: RNG seed.
        no_consecutive_repeated_ngram: k ≥ 0.
        no_repeated_ngram: n ≥ 0.

    Returns:
        ``B`` hypotheses (``path_tokens`` are the drawn tokens; the endpoints read their argmax).

    Raises:
        ValueError: τ ≤ 0, ``top_cand_n < 1``, ``top_p`` outside (0, 1] or a negative ban order.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    check_ban_options(no_consecutive_repeated_ngram, no_repeated_ngram)
    table = candidate_table(
        token_logprobs,
        links,
        graph_lengths,
        top_cand_n,
        beta,
        temperature,
        top_p,
        end_as_vertex=False,
    )
    rng = np.random.default_rng(seed)
    return candidate_walk(
        token_logprobs,
        links,
        graph_lengths,
        table,
        sample=True,
        top_p=top_p,
        consecutive=no_consecutive_repeated_ngram,
        repeated=no_repeated_ngram,
        rng=rng,
    )
