"""Rank correlation for judging a confidence score as a quality estimate.

:func:`spearman` is Spearman's ρ: Pearson's correlation of the two samples' ranks, ties given
their average rank (the textbook definition, as ``scipy.stats.spearmanr``);
:func:`bootstrap_interval` resamples sentences with replacement for a percentile interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks ``1 … n`` of ``values`` (float64), tied values sharing their average rank."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    start = 0
    while start < len(x):
        end = start + 1
        while end < len(x) and sorted_x[end] == sorted_x[start]:
            end += 1
        ranks[order[start:end]] = (start + end + 1) / 2.0  # mean of ranks start+1 … end
        start = end
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long samples.

    Returns:
        ρ in ``[−1, 1]``; NaN when either sample is constant.

    Raises:
        ValueError: different lengths, fewer than 2 values, or a NaN value.
    """
    if len(a) != len(b):
        raise ValueError(f"samples of different lengths: {len(a)} and {len(b)}")
    if len(a) < 2:
        raise ValueError("Spearman's rho needs at least 2 pairs")
    if (
        np.isnan(np.asarray(a, dtype=np.float64)).any()
        or np.isnan(np.asarray(b, dtype=np.float64)).any()
    ):
        raise ValueError("samples contain NaN")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    if denominator == 0:
        return float("nan")
    return float((ra * rb).sum() / denominator)


def bootstrap_interval(
    a: Sequence[float], b: Sequence[float], samples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`spearman` over resampled pairs.

    Returns:
        ``(low, high)``.
    """
    rng = np.random.default_rng(seed)
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    values = []
    for _ in range(samples):
        index = rng.integers(0, len(x), len(x))
        rho = spearman(x[index], y[index])
        if not np.isnan(rho):
            values.append(rho)
    tail = (1.0 - level) / 2.0
    return float(np.quantile(values, tail)), float(np.quantile(values, 1.0 - tail))
