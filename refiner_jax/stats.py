"""The statistics of every results table: percentile-bootstrap intervals over examples (one stream of resampled
index sets, so tables drawn with the same seed resample the same sets), paired intervals and AUROC.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import numpy as np

_MAX_BOOTSTRAP_CELLS = 4_000_000  # resampled indices held in memory at once (samples x examples)


def resamples(n: int, samples: int, seed: int, strata: Sequence[int] | None = None) -> Iterator[np.ndarray]:
    """`samples` resampled index sets of `n` examples (with replacement), in blocks [b, n] of at most
    `_MAX_BOOTSTRAP_CELLS` indices; the draws do not depend on the block size.

    With `strata` (sizes summing to `n`: consecutive groups, e.g. the test problems of each seed's run), every
    group is resampled within itself, so each set keeps every group's size."""
    if strata is not None and (sum(strata) != n or min(strata, default=0) < 1):
        raise ValueError(f"strata {list(strata)} must be positive sizes summing to {n}")
    rng = np.random.default_rng(seed)
    block = max(1, _MAX_BOOTSTRAP_CELLS // n)
    for start in range(0, samples, block):
        b = min(block, samples - start)
        if strata is None:
            yield rng.integers(0, n, size=(b, n))
        else:
            offsets = np.cumsum([0, *strata[:-1]])
            yield np.concatenate([at + rng.integers(0, size, size=(b, size)) for at, size in zip(offsets, strata)],
                                 axis=1)


def bootstrap_columns(values: np.ndarray, samples: int, seed: int, alpha: float,
                      strata: Sequence[int] | None = None):
    """Means and percentile-bootstrap bounds of each column of `values` [n, k], one set of resamples for all (each
    of `strata`'s consecutive groups resampled within itself, as `resamples`)."""
    n = values.shape[0]
    if n == 0:
        nan = np.full(values.shape[1], np.nan)
        return nan, nan, nan
    means = np.concatenate([values[idx].mean(axis=1) for idx in resamples(n, samples, seed, strata)],
                           axis=0)  # [samples, k]
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2], axis=0)
    return values.mean(axis=0), low, high


def bootstrap_ci(values: Sequence[float], samples: int = 1000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its (1 - alpha) percentile-bootstrap interval, resampling the
    values (examples) with replacement `samples` times. NaNs for an empty sequence."""
    if samples < 1:
        raise ValueError(f"bootstrap samples must be >= 1, got {samples}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    arr = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    mean, low, high = bootstrap_columns(arr, samples, seed, alpha)
    return float(mean[0]), float(low[0]), float(high[0])


def interval(point: float, values: np.ndarray, alpha: float) -> dict:
    """{mean: `point`, low, high}: the (1 - alpha) percentile interval of bootstrap `values`, NaNs left out (all NaN
    when `point` is NaN or no value is finite)."""
    finite = values[~np.isnan(values)]
    if np.isnan(point) or finite.size == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan}
    low, high = np.quantile(finite, [alpha / 2, 1 - alpha / 2])
    return {"mean": float(point), "low": float(low), "high": float(high)}


def error_auroc(confidence: Sequence[float], has_error: Sequence[bool]) -> float:
    """Area under the ROC curve of flagging errors by low `confidence` (e.g. the critic's log-probability of "No
    hint"): the chance that a random wrong hypothesis gets a lower confidence than a random right one, ties counting
    half (Mann-Whitney). 0.5 is chance; NaN when all hypotheses are right or all wrong."""
    conf = np.asarray(confidence, dtype=np.float64)
    wrong = np.asarray(has_error, dtype=bool)
    n_wrong, n_right = int(wrong.sum()), int((~wrong).sum())
    if n_wrong == 0 or n_right == 0:
        return float("nan")
    _, inverse, counts = np.unique(conf, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # 1-based ranks, ties get their mean rank
    return float((ranks[~wrong].sum() - n_right * (n_right + 1) / 2.0) / (n_wrong * n_right))


def paired_auroc(confidence: Sequence[float], has_error: Sequence[bool], groups: Sequence[Any]) -> float:
    """`error_auroc` within problems: over every (right, wrong) pair of hypotheses to the same problem (same
    `groups` value), the share where the right one gets the higher confidence, ties counting half. Unlike the
    pooled AUROC it cannot be earned by telling easy problems from hard ones. NaN without such pairs."""
    conf = np.asarray(confidence, dtype=np.float64)
    wrong = np.asarray(has_error, dtype=bool)
    _, group_ids = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    wins, pairs = 0.0, 0
    for g in range(int(group_ids.max()) + 1 if len(group_ids) else 0):
        members = group_ids == g
        right, bad = conf[members & ~wrong], conf[members & wrong]
        if len(right) and len(bad):
            diff = right[:, None] - bad[None, :]  # [right, wrong]
            wins += float(np.sum(diff > 0) + 0.5 * np.sum(diff == 0))
            pairs += diff.size
    return wins / pairs if pairs else float("nan")
