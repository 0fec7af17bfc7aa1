"""The parity study's statistics over seeds: the permutation test of the verdict rule, the
interval of the difference it leaves open, the equivalence test against a margin stated in
advance, and how often the end-return rule passes or fails for sides of a known distance.

All permutation-based, so no distribution is assumed and no dependency beyond numpy is needed:
the interval is the set of shifts the rule's own test does not reject (test inversion,
Lehmann, "Testing Statistical Hypotheses", 3.5), and the equivalence test is the two one-sided
tests (Schuirmann 1987) done as one-sided permutation tests of the shifted values.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

ALPHA = 0.05
PERMUTATIONS = 10_000
PERMUTATION_SEED = 0


def permutation_diffs(a: np.ndarray, b: np.ndarray, permutations: int = PERMUTATIONS,
                      seed: int = PERMUTATION_SEED) -> tuple[float, np.ndarray, bool]:
    """mean(a) - mean(b), the same difference under each relabelling, and whether those are
    every split (exact: no more splits than `permutations`, a few seeds a side) or a seeded
    sample of `permutations` shuffles."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    pooled = np.concatenate([a, b])
    observed = a.mean() - b.mean()
    if math.comb(pooled.size, a.size) <= permutations:
        sides = np.array(list(itertools.combinations(range(pooled.size), a.size)))  # [C, n_a]
        sums = pooled[sides].sum(axis=1)  # [C]
        return observed, sums / a.size - (pooled.sum() - sums) / b.size, True
    rng = np.random.default_rng(seed)
    parts, done = [], 0
    while done < permutations:  # chunks keep the [k, n] index matrix small
        k = min(1000, permutations - done)
        idx = rng.permuted(np.tile(np.arange(pooled.size), (k, 1)), axis=1)  # [k, n]
        shuffled = pooled[idx]
        parts.append(shuffled[:, :a.size].mean(axis=1) - shuffled[:, a.size:].mean(axis=1))
        done += k
    return observed, np.concatenate(parts), False  # [permutations]


def share_at_least(diffs: np.ndarray, observed: float, exact: bool) -> float:
    """The p of `observed` among `diffs`: a relabelling equal to it counts (float summation
    order aside); a sampled test counts the observed labelling too."""
    hits = diffs >= observed - 1e-12 * max(1.0, abs(observed))
    return float(np.mean(hits)) if exact else (int(hits.sum()) + 1) / (hits.size + 1)


def permutation_p(a: np.ndarray, b: np.ndarray, permutations: int = PERMUTATIONS,
                  seed: int = PERMUTATION_SEED) -> float:
    """Two-sided permutation test of mean(a) - mean(b): the share of relabellings (and the
    observed one) whose |difference| is at least the observed one. Exact, over every split,
    when there are no more splits than `permutations` (a few seeds a side): a sampled p there
    would scatter around the threshold at the smallest p the split count allows."""
    observed, diffs, exact = permutation_diffs(a, b, permutations, seed)
    return share_at_least(np.abs(diffs), abs(observed), exact)


def one_sided_p(a: np.ndarray, b: np.ndarray, greater: bool,
                permutations: int = PERMUTATIONS) -> float:
    """One-sided permutation p of mean(a) - mean(b) > 0 (`greater`) or < 0."""
    observed, diffs, exact = permutation_diffs(a, b, permutations)
    sign = 1.0 if greater else -1.0
    return share_at_least(sign * diffs, sign * observed, exact)


def shift_interval(a: np.ndarray, b: np.ndarray, level: float = 1 - ALPHA,
                   permutations: int = PERMUTATIONS) -> tuple[float, float]:
    """The interval of mean(b) - mean(a) the two-sided permutation test leaves open at
    `level`: every shift d with p(a, b - d) > 1 - level. (-inf, inf) where no split of the
    values can reach that p (3 seeds a side: 20 splits, p >= 0.1)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    alpha = 1 - level
    splits = math.comb(a.size + b.size, a.size)
    if splits <= permutations and (2 if a.size == b.size else 1) / splits > alpha:
        return -math.inf, math.inf
    center = b.mean() - a.mean()
    scale = max(np.std(np.concatenate([a - a.mean(), b - b.mean()])), 1e-12 * max(
        1.0, abs(center)))

    def rejected(d: float) -> bool:
        return permutation_p(a, b - d, permutations) <= alpha

    ends = []
    for sign in (-1.0, 1.0):
        inside, step = 0.0, scale
        while not rejected(center + sign * step):  # widen until the test rejects
            inside, step = step, 2 * step
        outside = step
        for _ in range(40):  # then halve the bracket [inside, outside]
            mid = (inside + outside) / 2
            inside, outside = (inside, mid) if rejected(center + sign * mid) else (mid, outside)
        ends.append(center + sign * inside)
    return ends[0], ends[1]


def tost_p(a: np.ndarray, b: np.ndarray, margin: float,
           permutations: int = PERMUTATIONS) -> float:
    """Two one-sided tests of |mean(b) - mean(a)| < margin: the larger p of "b - a > -margin"
    and "b - a < margin", each a one-sided permutation test of the values shifted to the
    margin. Equivalent within the margin at p < ALPHA."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    above = one_sided_p(b + margin, a, greater=True, permutations=permutations)
    below = one_sided_p(b - margin, a, greater=False, permutations=permutations)
    return max(above, below)


def end_rule_rates(seeds: int, shift: float, trials: int = 200_000, seed: int = 0) -> float:
    """How often the end rule passes (|mean difference| < the larger seed std, ddof 1) for two
    sides of `seeds` normal seed values with std 1 whose means are `shift` apart: a Monte
    Carlo estimate with a fixed seed."""
    rng = np.random.default_rng(seed)
    a = rng.normal(0.0, 1.0, (trials, seeds))
    b = rng.normal(shift, 1.0, (trials, seeds))
    diff = np.abs(a.mean(axis=1) - b.mean(axis=1))
    margin = np.maximum(a.std(axis=1, ddof=1), b.std(axis=1, ddof=1))
    return float(np.mean(diff < margin))
