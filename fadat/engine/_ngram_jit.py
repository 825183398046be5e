"""The compiled (numba) part of :class:`fadat.engine.ngram.NgramModel`: its hash table of
n-grams and the back-off score of one word after a context. Imported when a model is read or
a search runs, so that ``import fadat.engine`` does not load numba. Imports numba and numpy
only; compiled functions are cached on disk as :mod:`fadat.engine._beam_jit`'s are.

The n-grams are *rows*: row ``w`` is the 1-gram of word id ``w`` (``0 ≤ w < V``), and every
longer n-gram has a row after them, found through one open-addressing table whose key for
``(w_1 … w_n)`` is ``(row(w_1 … w_{n−1}) + 1) · V + w_n`` (``n ≥ 2``; prefix rows are unique, so
keys of different n-grams never meet and never fall below ``V``).

A *context* is an ``(N − 1,)`` int64 array for an order-``N`` model: entry ``m − 1`` is the row
of the context's last ``m`` words, −1 where that n-gram is not in the model (and then every
longer one is −1 too). Scoring word ``w`` after context ``c`` looks up ``(c_m, w)`` for
``m = 1, 2 …`` until one is missing, which gives both the probability (the longest n-gram
found) and the next context; the back-off weights of the longer contexts are added after it,
in KenLM's order, in float32 (KenLM's ``FullScore``), so the sums equal KenLM's.
"""

from __future__ import annotations

from fadat.engine._numba_common import njit_cached as _jit
from fadat.engine._numba_common import slot as _slot


@_jit
def lookup(keys, rows, key):
    """The row of ``key``, or −1 where no n-gram has it."""
    s = _slot(keys, key)
    return rows[s] if keys[s] == key else -1


@_jit
def insert_unigrams(keys, rows, V):
    """Insert the 1-grams: word id ``w``'s key and row are ``w``."""
    for w in range(V):
        s = _slot(keys, w)
        keys[s], rows[s] = w, w


@_jit
def insert_order(keys, rows, words, first_row, V):
    """Insert the n-grams ``words`` ``(count, n)`` int64 (``n ≥ 2``, word ids) as rows
    ``first_row …`` in file order, their ``(n − 1)``-gram prefixes already inserted.

    Returns −1, or the index of the first n-gram whose prefix is missing (``−2 − index``: that
    n-gram is inserted already, a duplicate), which the caller reports with its line.
    """
    n = words.shape[1]
    for k in range(words.shape[0]):
        r = words[k, 0]
        for q in range(1, n - 1):
            r = lookup(keys, rows, (r + 1) * V + words[k, q])
            if r < 0:
                return k
        key = (r + 1) * V + words[k, n - 1]
        s = _slot(keys, key)
        if keys[s] == key:
            return -2 - k
        keys[s], rows[s] = key, first_row + k
    return -1


@_jit
def score(context, w, V, keys, rows, prob, backoff, out):
    """log10 P(``w`` | ``context``) under the back-off model, and the next context in ``out``.

    Args:
        context: ``(N − 1,)`` int64, the rows of the context's suffixes (module docstring).
        w: the word id (``<unk>``'s for a word the model does not know).
        V: the number of word ids (1-grams).
        keys, rows: the n-gram table.
        prob, backoff: ``(R,)`` float32 log10 probability and back-off weight of each row.
        out: ``(N − 1,)`` int64, written with the context after ``w`` (may not be ``context``).

    Returns:
        float32: the probability of the longest n-gram ``(context's last m words, w)`` in the
        model, plus the back-off weights of the context's suffixes longer than ``m``.
    """
    K = context.shape[0]
    p = prob[w]
    matched = 0
    if K > 0:
        out[0] = w
    for m in range(1, K + 1):
        r = context[m - 1]
        if r < 0:
            break
        g = lookup(keys, rows, (r + 1) * V + w)
        if g < 0:
            break
        p = prob[g]
        matched = m
        if m < K:
            out[m] = g
    for m in range(matched + 1, K):
        out[m] = -1
    for m in range(matched + 1, K + 1):
        r = context[m - 1]
        if r < 0:
            break
        p += backoff[r]
    return p
