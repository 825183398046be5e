"""The compiled (numba) search loop of the DAG beam search
(:func:`fadat.engine.beam_np.beam_search`, which :func:`fadat.decoding.beam.beam_search` runs
too); the search itself is described in :mod:`fadat.decoding.beam`. Imported only when a beam
search runs, so that neither ``import fadat`` nor the engine (:mod:`fadat.engine`) loads numba.
Imports numba and numpy only.

One sentence's search lives in an *arena*, a tuple of arrays (capacities grow by doubling):

- ``nodes`` ``(N, 3)`` int64: the prefix trie, one row per node: parent, last token, length;
  node 0 is the empty prefix (parent −1, token −1);
- ``node_lm`` ``(N,)`` float64: the cumulative LM log10 score of each node (written by the
  caller between steps; zeros without an LM);
- ``child_keys``, ``child_vals`` ``(2N,)`` int64: open-addressing table ``(node, token) → child``;
- ``ents`` ``(E, 6)`` int64: the states, one row each: back-pointer (state id, −1 for the start),
  token read by the best contribution (−1 at the end vertex), vertex, node, free flag (0/1), next
  state of the same vertex (−1 = last);
- ``ent_f`` ``(E, 2)`` float64: log-sum-exp score and best single contribution of each state;
- ``ent_keys``, ``ent_vals`` ``(2E,)`` int64: open-addressing table ``(node, free, vertex) →
  state``;
- ``verts`` ``(L, 3)`` int64: each vertex's first and last state (insertion order) and count;
- ``counters`` ``(4,)`` int64: nodes used, states used, and the capacities a refused
  :func:`step` asks for.

Every compiled function is cached on disk (``cache=True``: in ``__pycache__`` next to this
file, ``fadat/engine/_beam_jit.py``, else in numba's user-wide cache directory, or in
``NUMBA_CACHE_DIR``); where no directory is writable they are compiled in each process instead.
"""

from __future__ import annotations

import math

import numpy as np

import fadat.engine._ngram_jit as _ngram_jit
from fadat.engine._numba_common import njit_cached as _jit
from fadat.engine._numba_common import slot as _slot

# column indices of ``nodes``, ``ents``, ``ent_f`` and ``verts``
N_PARENT, N_TOK, N_LEN = 0, 1, 2
E_BACK, E_TOK, E_VERT, E_NODE, E_FREE, E_NEXT = 0, 1, 2, 3, 4, 5
F_LSE, F_BEST = 0, 1
V_HEAD, V_TAIL, V_COUNT = 0, 1, 2


@_jit
def _child_key(node, t):
    return (node << 32) | t


@_jit
def _ent_key(node, free, j):
    return (((node << 1) | free) << 32) | j


@_jit
def new_arena(L, start_tok, node_cap, ent_cap):
    """An arena for a graph of ``L`` vertices holding the empty prefix and the start state
    (vertex 0, free, score 0, token ``start_tok``); capacities are powers of two."""
    nodes = np.empty((node_cap, 3), np.int64)
    nodes[0, N_PARENT], nodes[0, N_TOK], nodes[0, N_LEN] = -1, -1, 0
    node_lm = np.zeros(node_cap)
    child_keys = np.full(2 * node_cap, -1, np.int64)
    child_vals = np.empty(2 * node_cap, np.int64)
    ents = np.empty((ent_cap, 6), np.int64)
    ents[0, E_BACK], ents[0, E_TOK], ents[0, E_VERT] = -1, start_tok, 0
    ents[0, E_NODE], ents[0, E_FREE], ents[0, E_NEXT] = 0, 1, -1
    ent_f = np.zeros((ent_cap, 2))
    ent_keys = np.full(2 * ent_cap, -1, np.int64)
    ent_vals = np.empty(2 * ent_cap, np.int64)
    verts = np.full((L, 3), -1, np.int64)
    verts[:, V_COUNT] = 0
    verts[0, V_HEAD], verts[0, V_TAIL], verts[0, V_COUNT] = 0, 0, 1
    counters = np.array([1, 1, 0, 0], np.int64)
    return (
        nodes,
        node_lm,
        child_keys,
        child_vals,
        ents,
        ent_f,
        ent_keys,
        ent_vals,
        verts,
        counters,
    )


@_jit
def grown(arena):
    """The arena with capacities for the nodes and states that a refused :func:`step` asked for
    (``counters[2:4]``), tables rebuilt from the rows."""
    nodes, node_lm, child_keys, child_vals, ents, ent_f, ent_keys, ent_vals, verts, counters = arena
    n_nodes, n_ents = counters[0], counters[1]
    node_cap, ent_cap = nodes.shape[0], ents.shape[0]
    while node_cap < counters[2]:
        node_cap *= 2
    while ent_cap < counters[3]:
        ent_cap *= 2
    if node_cap > nodes.shape[0]:
        nodes2 = np.empty((node_cap, 3), np.int64)
        nodes2[:n_nodes] = nodes[:n_nodes]
        node_lm2 = np.zeros(node_cap)
        node_lm2[:n_nodes] = node_lm[:n_nodes]
        nodes, node_lm = nodes2, node_lm2
        child_keys = np.full(2 * node_cap, -1, np.int64)
        child_vals = np.empty(2 * node_cap, np.int64)
        for c in range(1, n_nodes):
            key = _child_key(nodes[c, N_PARENT], nodes[c, N_TOK])
            s = _slot(child_keys, key)
            child_keys[s], child_vals[s] = key, c
    if ent_cap > ents.shape[0]:
        ents2 = np.empty((ent_cap, 6), np.int64)
        ents2[:n_ents] = ents[:n_ents]
        ent_f2 = np.zeros((ent_cap, 2))
        ent_f2[:n_ents] = ent_f[:n_ents]
        ents, ent_f = ents2, ent_f2
        ent_keys = np.full(2 * ent_cap, -1, np.int64)
        ent_vals = np.empty(2 * ent_cap, np.int64)
        for e in range(1, n_ents):  # state 0 (the start) is never looked up
            key = _ent_key(ents[e, E_NODE], ents[e, E_FREE], ents[e, E_VERT])
            s = _slot(ent_keys, key)
            ent_keys[s], ent_vals[s] = key, e
    return (
        nodes,
        node_lm,
        child_keys,
        child_vals,
        ents,
        ent_f,
        ent_keys,
        ent_vals,
        verts,
        counters,
    )


@_jit
def _kept_states(i, pw, beam_size, max_per_len, gamma, arena):
    """Vertex ``i``'s states ranked by ``(score + γ·lm) / max(1, length)^α`` (``pw[length]``),
    best first, ties in insertion order, at most ``max_per_len`` per prefix length and
    ``beam_size`` overall: ``(S,)`` state ids."""
    nodes, node_lm, _, _, ents, ent_f, _, _, verts, _ = arena
    m = verts[i, V_COUNT]
    ids = np.empty(m, np.int64)
    rank = np.empty(m)
    e = verts[i, V_HEAD]
    for q in range(m):
        node = ents[e, E_NODE]
        ids[q] = e
        rank[q] = (ent_f[e, F_LSE] + gamma * node_lm[node]) / pw[nodes[node, N_LEN]]
        e = ents[e, E_NEXT]
    order = np.argsort(-rank, kind="mergesort")  # stable, as the reference's sorted()
    per_len = np.zeros(pw.shape[0], np.int64)
    kept = np.empty(min(m, beam_size), np.int64)
    n_kept = 0
    for q in order:
        k = nodes[ents[ids[q], E_NODE], N_LEN]
        if per_len[k] < max_per_len:
            per_len[k] += 1
            kept[n_kept] = ids[q]
            n_kept += 1
            if n_kept == beam_size:
                break
    return kept[:n_kept]


@_jit
def _candidates(i, top_lp, top_tok, ln, top_p, max_succ):
    """Source vertex ``i``'s candidate pairs, best first: destinations ``(C,)``, tokens ``(C,)``
    (−1 = the end vertex) and scores ``(C,)``. Pairs are ordered by score, ties by the
    reference's order (destination, then column of ``top_tok``, the end vertex last); non-finite
    scores are dropped; a pair is kept while the probability mass before it is below ``top_p``
    (each pair tested, as the reference's mask), then the first ``max_succ`` (−1 = all)."""
    L, n = top_lp.shape
    end = L - 1
    total = (end - 1 - i) * n + 1
    cap = total if max_succ < 0 else min(max_succ, total)
    bj = np.empty(cap, np.int64)
    bt = np.empty(cap, np.int64)
    bs = np.empty(cap)
    c = 0
    if max_succ < 0:  # every finite pair, then a stable sort
        for j in range(i + 1, end):
            lij = ln[i, j]
            for k in range(n):
                s = lij + top_lp[j, k]
                if math.isfinite(s):
                    bj[c], bt[c], bs[c] = j, top_tok[j, k], s
                    c += 1
        if math.isfinite(ln[i, end]):
            bj[c], bt[c], bs[c] = end, -1, ln[i, end]
            c += 1
        order = np.argsort(-bs[:c], kind="mergesort")
        bj, bt, bs = bj[order], bt[order], bs[order]
    else:  # the best ``cap`` by insertion into a sorted buffer (a later equal pair goes after)
        for j in range(i + 1, end + 1):
            lij = ln[i, j]
            if not math.isfinite(lij):
                continue
            for k in range(n if j < end else 1):
                s = lij + top_lp[j, k] if j < end else lij
                if not math.isfinite(s):
                    continue
                if c < cap:
                    q = c
                    c += 1
                elif s > bs[cap - 1]:
                    q = cap - 1
                else:
                    break  # the row is sorted: its later pairs score no higher
                while q > 0 and bs[q - 1] < s:
                    bj[q], bt[q], bs[q] = bj[q - 1], bt[q - 1], bs[q - 1]
                    q -= 1
                bj[q], bt[q], bs[q] = j, top_tok[j, k] if j < end else -1, s
    if top_p < 1.0:
        kept = 0
        mass = 0.0
        for q in range(c):
            w = math.exp(bs[q])
            mass += w
            if mass - w < top_p:
                bj[kept], bt[kept], bs[kept] = bj[q], bt[q], bs[q]
                kept += 1
        c = kept
    if max_succ >= 0:
        c = min(c, max_succ)
    return bj[:c], bt[:c], bs[:c]


@_jit
def step(i, top_lp, top_tok, ln, pw, beam_size, max_per_len, top_p, max_succ, gamma, pad, arena):
    """Rank and prune vertex ``i``'s states and expand the kept ones with ``i``'s candidates,
    merging into the destinations' states (log-add-exp; the best single contribution keeps the
    back-pointer, the first on ties). New trie nodes take the ids ``counters[0] …``.

    Returns the number of new nodes, or −1 (nothing changed) when the arena lacks room: then
    ``counters[2:4]`` hold the capacities needed; call again with :func:`grown`'s arena.
    """
    nodes, node_lm, child_keys, child_vals, ents, ent_f, ent_keys, ent_vals, verts, counters = arena
    if verts[i, V_COUNT] == 0:
        return 0
    kept = _kept_states(i, pw, beam_size, max_per_len, gamma, arena)
    cj, ct, cs = _candidates(i, top_lp, top_tok, ln, top_p, max_succ)
    most = kept.shape[0] * cj.shape[0]  # contributions, each at most one new node and state
    if counters[0] + most > nodes.shape[0] or counters[1] + most > ents.shape[0]:
        counters[2], counters[3] = counters[0] + most, counters[1] + most
        return -1
    first_new = counters[0]
    for e in kept:
        score, best = ent_f[e, F_LSE], ent_f[e, F_BEST]
        node, free = ents[e, E_NODE], ents[e, E_FREE]
        last = nodes[node, N_TOK]
        for c in range(cj.shape[0]):
            j, t, sc = cj[c], ct[c], cs[c]
            if t < 0 or t == pad:  # end vertex (its token is summed out) or pad
                key_node, key_free = node, 1
            elif free == 0 and t == last:  # consecutive duplicate: the prefix does not grow
                key_node, key_free = node, 0
            else:
                ck = _child_key(node, t)
                s = _slot(child_keys, ck)
                if child_keys[s] == -1:
                    new = counters[0]
                    counters[0] += 1
                    nodes[new, N_PARENT], nodes[new, N_TOK] = node, t
                    nodes[new, N_LEN] = nodes[node, N_LEN] + 1
                    node_lm[new] = 0.0
                    child_keys[s], child_vals[s] = ck, new
                key_node, key_free = child_vals[s], 0
            ek = _ent_key(key_node, key_free, j)
            s = _slot(ent_keys, ek)
            s_new = score + sc
            if ent_keys[s] == -1:
                x = counters[1]
                counters[1] += 1
                ent_keys[s], ent_vals[s] = ek, x
                ents[x, E_BACK], ents[x, E_TOK], ents[x, E_VERT] = e, t, j
                ents[x, E_NODE], ents[x, E_FREE], ents[x, E_NEXT] = key_node, key_free, -1
                ent_f[x, F_LSE], ent_f[x, F_BEST] = s_new, best + sc
                if verts[j, V_COUNT] == 0:
                    verts[j, V_HEAD] = x
                else:
                    ents[verts[j, V_TAIL], E_NEXT] = x
                verts[j, V_TAIL] = x
                verts[j, V_COUNT] += 1
            else:
                x = ent_vals[s]
                old = ent_f[x, F_LSE]
                if old >= s_new:
                    ent_f[x, F_LSE] = old + math.log1p(math.exp(s_new - old))
                else:
                    ent_f[x, F_LSE] = s_new + math.log1p(math.exp(old - s_new))
                if best + sc > ent_f[x, F_BEST]:
                    ent_f[x, F_BEST] = best + sc
                    ents[x, E_BACK], ents[x, E_TOK] = e, t
    return counters[0] - first_new


@_jit
def vertex_nodes(j, arena):
    """The trie nodes ``(S,)`` of vertex ``j``'s states, in insertion order."""
    ents, verts = arena[4], arena[8]
    out = np.empty(verts[j, V_COUNT], np.int64)
    e = verts[j, V_HEAD]
    for q in range(out.shape[0]):
        out[q] = ents[e, E_NODE]
        e = ents[e, E_NEXT]
    return out


@_jit
def best_path(top_tok, pw, gamma, final_lm, arena):
    """The end vertex's best state by ``(score + γ·(lm + final_lm)) / max(1, length)^α`` (the
    first on ties; ``final_lm`` ``(N,)``: the LM's ``</s>`` score per node) and its single best
    path: vertices ``(P,)``, tokens ``(P,)`` (endpoints read column 0, the argmax), the column of
    ``top_tok`` of each token ``(P,)`` and the output tokens ``(T,)``. Raises ValueError when the
    end vertex has no state."""
    nodes, node_lm, _, _, ents, ent_f, _, _, verts, _ = arena
    end = verts.shape[0] - 1
    best, best_rank = -1, 0.0
    e = verts[end, V_HEAD]
    for _ in range(verts[end, V_COUNT]):
        node = ents[e, E_NODE]
        lm = node_lm[node] + final_lm[node]
        r = (ent_f[e, F_LSE] + gamma * lm) / pw[nodes[node, N_LEN]]
        if best < 0 or r > best_rank:
            best, best_rank = e, r
        e = ents[e, E_NEXT]
    if best < 0:
        raise ValueError("links has no path from vertex 0 to the end vertex")
    size = 0
    e = best
    while e >= 0:
        size += 1
        e = ents[e, E_BACK]
    path = np.empty(size, np.int64)
    ptoks = np.empty(size, np.int64)
    cols = np.zeros(size, np.int64)
    e = best
    for q in range(size - 1, -1, -1):
        v, t = ents[e, E_VERT], ents[e, E_TOK]
        path[q] = v
        if 0 < q < size - 1:
            while top_tok[v, cols[q]] != t:
                cols[q] += 1
        ptoks[q] = top_tok[v, cols[q]]
        e = ents[e, E_BACK]
    node = ents[best, E_NODE]
    out = np.empty(nodes[node, N_LEN], np.int64)
    for q in range(out.shape[0] - 1, -1, -1):
        out[q] = nodes[node, N_TOK]
        node = nodes[node, N_PARENT]
    return path, ptoks, cols, out


@_jit
def step_grown(
    i, top_lp, top_tok, ln, pw, beam_size, max_per_len, top_p, max_succ, gamma, pad, arena
):
    """:func:`step`, with the arena grown (:func:`grown`) and the step run again until it has
    room: ``(the number of new nodes, the arena)``."""
    while True:
        new = step(
            i, top_lp, top_tok, ln, pw, beam_size, max_per_len, top_p, max_succ, gamma, pad, arena
        )
        if new >= 0:
            return new, arena
        arena = grown(arena)


@_jit
def search(top_lp, top_tok, ln, pw, beam_size, max_per_len, top_p, max_succ, pad, arena):
    """The whole search of one sentence without an LM: :func:`step_grown` at every vertex, then
    :func:`best_path`."""
    for i in range(ln.shape[0] - 1):
        _, arena = step_grown(
            i, top_lp, top_tok, ln, pw, beam_size, max_per_len, top_p, max_succ, 0.0, pad, arena
        )
    return best_path(top_tok, pw, 0.0, np.zeros(arena[0].shape[0]), arena)


@_jit
def search_ngram(
    top_lp,
    top_tok,
    ln,
    pw,
    beam_size,
    max_per_len,
    top_p,
    max_succ,
    gamma,
    pad,
    arena,
    contexts,
    token_words,
    eos,
    V,
    keys,
    rows,
    prob,
    backoff,
):
    """The whole search of one sentence with an n-gram LM (:class:`fadat.engine.ngram.NgramModel`)
    looked up in compiled code: :func:`step_grown` at every vertex, the LM's score of each trie node
    it created (``node_lm`` of the parent plus the node's word, in float64 as the KenLM path
    adds), then :func:`best_path` with the LM's ``</s>`` at the end vertex.

    ``contexts`` ``(C, N − 1)`` int64 holds the LM context of each trie node
    (:mod:`fadat.engine._ngram_jit`), row 0 the start's; it grows with the arena.
    ``token_words`` ``(V_model,)`` int64: the LM word id of each token id. The rest after
    ``arena`` are :attr:`fadat.engine.ngram.NgramModel.tables`.
    """
    K = contexts.shape[1]
    for i in range(ln.shape[0] - 1):
        first = arena[9][0]
        new, arena = step_grown(
            i, top_lp, top_tok, ln, pw, beam_size, max_per_len, top_p, max_succ, gamma, pad, arena
        )
        nodes, node_lm = arena[0], arena[1]
        if nodes.shape[0] > contexts.shape[0]:
            wider = np.empty((nodes.shape[0], K), np.int64)
            wider[:first] = contexts[:first]
            contexts = wider
        for c in range(first, first + new):
            parent = nodes[c, N_PARENT]
            s = _ngram_jit.score(
                contexts[parent],
                token_words[nodes[c, N_TOK]],
                V,
                keys,
                rows,
                prob,
                backoff,
                contexts[c],
            )
            node_lm[c] = node_lm[parent] + np.float64(s)
    final_lm = np.zeros(arena[0].shape[0])
    scratch = np.empty(K, np.int64)
    end = vertex_nodes(ln.shape[0] - 1, arena)
    for q in range(end.shape[0]):
        node = end[q]
        final_lm[node] = np.float64(
            _ngram_jit.score(contexts[node], eos, V, keys, rows, prob, backoff, scratch)
        )
    return best_path(top_tok, pw, gamma, final_lm, arena)
