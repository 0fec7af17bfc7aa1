"""Human-normalised scores and rliable's aggregate metrics with stratified bootstrap intervals.

A small, numpy-only re-implementation of what `rliable` (Agarwal et al. 2021, "Deep RL at the
Edge of the Statistical Precipice") computes, because rliable 1.2 pulls in `arch`, whose 7.x
release does not import under pandas 3. Semantics follow rliable's `metrics.py` and
`library.py` exactly:

- scores are a matrix `[runs, games]`;
- median / mean: of the per-game means over runs;
- IQM: the 25% trimmed mean of all runs x games pooled (scipy's `trim_mean(x, 0.25,
  axis=None)`: drop int(0.25 n) values at each end of the sorted scores);
- optimality gap: gamma - mean(min(score, gamma)) over all runs x games, gamma = 1;
- stratified bootstrap: each replicate resamples the runs of every game independently, with
  replacement (rliable's StratifiedBootstrap with task_bootstrap=False); intervals are the
  percentile method (the 2.5% and 97.5% quantiles of the replicates).

Ray-free and pandas-free: numbers in, numbers out.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

GAMMA = 1.0  # optimality-gap threshold in human-normalised units (rliable's default)
TRIM = 0.25  # IQM trims this fraction at each end


def human_normalized(score, random_score: float, human_score: float):
    """(score - random) / (human - random): 0 = random play, 1 = human."""
    return (np.asarray(score, dtype=float) - random_score) / (human_score - random_score)


def _check(scores) -> np.ndarray:
    x = np.asarray(scores, dtype=float)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"scores must be a non-empty [runs, games] matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("scores contain NaN or inf: drop runs without a score first")
    return x


def median(scores) -> float:
    """Median over games of the per-game mean score."""
    return float(np.median(_check(scores).mean(axis=0)))


def mean(scores) -> float:
    """Mean over games of the per-game mean score."""
    return float(_check(scores).mean(axis=0).mean())


def iqm(scores) -> float:
    """Interquartile mean of all runs x games pooled (25% trimmed mean)."""
    flat = np.sort(_check(scores), axis=None)
    cut = int(TRIM * flat.size)
    return float(flat[cut:flat.size - cut].mean())


def optimality_gap(scores, gamma: float = GAMMA) -> float:
    """How far below gamma the runs fall on average; scores above gamma count as gamma."""
    return float(gamma - np.minimum(_check(scores), gamma).mean())


AGGREGATES: dict[str, Callable[[np.ndarray], float]] = {
    "median": median, "iqm": iqm, "mean": mean, "optimality_gap": optimality_gap}


# Vectorised forms over a stack of replicates [reps, runs, games] -> [reps].
def _median_b(x):
    return np.median(x.mean(axis=1), axis=1)


def _mean_b(x):
    return x.mean(axis=(1, 2))


def _iqm_b(x):
    flat = np.sort(x.reshape(x.shape[0], -1), axis=1)  # [reps, runs, games] -> [reps, runs*games]
    cut = int(TRIM * flat.shape[1])
    return flat[:, cut:flat.shape[1] - cut].mean(axis=1)


def _gap_b(x):
    return GAMMA - np.minimum(x, GAMMA).mean(axis=(1, 2))


_BATCHED = {"median": _median_b, "iqm": _iqm_b, "mean": _mean_b, "optimality_gap": _gap_b}
_CHUNK = 2000  # replicates per vectorised block: bounds memory for 57 games x many runs


def _replicates(scores: np.ndarray, reps: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every aggregate on `reps` stratified resamples of `scores` [runs, games]."""
    runs, games = scores.shape
    out: dict[str, list] = {name: [] for name in _BATCHED}
    cols = np.arange(games)[None, None, :]  # [1, 1, games]
    for start in range(0, reps, _CHUNK):
        n = min(_CHUNK, reps - start)
        # One run index per (replicate, slot, game): games are strata, resampled independently.
        idx = rng.integers(0, runs, size=(n, runs, games))
        sample = scores[idx, cols]  # [n, runs, games]
        for name, fn in _BATCHED.items():
            out[name].append(fn(sample))
    return {name: np.concatenate(parts) for name, parts in out.items()}


def _interval(values: np.ndarray, size: float) -> tuple[float, float]:
    lo, hi = np.percentile(values, [50 * (1 - size), 50 * (1 + size)])
    return float(lo), float(hi)


def interval_estimates(scores, reps: int = 50_000, size: float = 0.95,
                       seed: int = 0) -> dict[str, dict[str, float]]:
    """Point estimate and stratified-bootstrap percentile interval of every aggregate.

    Returns {metric: {"point", "lo", "hi"}} for median, iqm, mean and optimality_gap.
    """
    x = _check(scores)
    reps_by_metric = _replicates(x, reps, np.random.default_rng(seed))
    out = {}
    for name, fn in AGGREGATES.items():
        lo, hi = _interval(reps_by_metric[name], size)
        out[name] = {"point": fn(x), "lo": lo, "hi": hi}
    return out


def difference_estimates(scores_a, scores_b, reps: int = 50_000, size: float = 0.95,
                         seed: int = 0) -> dict[str, dict[str, float]]:
    """Aggregate(B) - aggregate(A) with a percentile interval.

    A and B may hold different numbers of runs; the games (columns) must match. Each side is
    resampled independently, stratified by game (rliable's StratifiedIndependentBootstrap).
    """
    a, b = _check(scores_a), _check(scores_b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"A has {a.shape[1]} games but B has {b.shape[1]}")
    rng = np.random.default_rng(seed)
    rep_a, rep_b = _replicates(a, reps, rng), _replicates(b, reps, rng)
    out = {}
    for name, fn in AGGREGATES.items():
        lo, hi = _interval(rep_b[name] - rep_a[name], size)
        out[name] = {"point": fn(b) - fn(a), "lo": lo, "hi": hi}
    return out


def geometric_mean_ratio_ci(minutes_a: Mapping[str, np.ndarray],
                            minutes_b: Mapping[str, np.ndarray], reps: int = 50_000,
                            size: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Geometric mean over games of mean(B)/mean(A), with a stratified bootstrap interval.

    Each game's runs of A and of B are resampled independently; a ratio of times averages
    correctly on a log scale (a 2x speed-up and a 2x slow-down cancel).
    """
    games = sorted(set(minutes_a) & set(minutes_b))
    if not games:
        raise ValueError("no game has runs in both A and B")
    rng = np.random.default_rng(seed)
    logs = np.zeros(reps)
    point = 0.0
    for game in games:
        a = np.asarray(minutes_a[game], dtype=float)
        b = np.asarray(minutes_b[game], dtype=float)
        point += np.log(b.mean() / a.mean())
        ra = a[rng.integers(0, a.size, size=(reps, a.size))].mean(axis=1)
        rb = b[rng.integers(0, b.size, size=(reps, b.size))].mean(axis=1)
        logs += np.log(rb / ra)
    lo, hi = _interval(np.exp(logs / len(games)), size)
    return {"point": float(np.exp(point / len(games))), "lo": lo, "hi": hi, "games": len(games)}
