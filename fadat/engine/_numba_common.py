"""What the compiled modules (:mod:`fadat.engine._beam_jit`, :mod:`fadat.engine._ngram_jit`)
share: the decorator that caches compiled functions on disk where it can, and the slot lookup
of their int64 open-addressing hash tables. Imports numba only."""

from __future__ import annotations

import numba

# 0x9E3779B97F4A7C15 as int64 (Fibonacci hashing; int64 products wrap in numba)
GOLDEN = -7046029254386353131


def njit_cached(fn):
    """``numba.njit(cache=True)``, or without the on-disk cache where numba finds no writable
    cache directory (it raises RuntimeError at decoration then)."""
    try:
        return numba.njit(cache=True)(fn)
    except RuntimeError:
        return numba.njit(fn)


@njit_cached
def slot(keys, key):
    """The slot of ``key`` (≥ 0) in the open-addressing table ``keys`` (−1 = empty, a power of
    two long), or the empty slot where it would go (linear probing; the table is at most half
    full)."""
    mask = keys.shape[0] - 1
    h = key * GOLDEN
    s = (h ^ (h >> 29)) & mask
    while keys[s] != key and keys[s] != -1:
        s = (s + 1) & mask
    return s
