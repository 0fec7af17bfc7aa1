"""The scheduling arithmetic `distppo plan` and `distppo status` share: trials onto slots.

A slot is one trial's place on the cluster (trials_per_node x nodes, or max_concurrent_trials).
LPT list scheduling (Graham 1969): longest trial first, each onto the slot that frees first.
It is within 4/3 of the best possible makespan; Tune itself starts trials in grid order as
slots free, which for trials of near-equal length (one game's seeds, 10M steps each) gives the
same makespan. Pure arithmetic, no Ray.
"""
from __future__ import annotations

import heapq
from typing import Sequence


def lpt_makespan(durations: Sequence[float], slots: int, busy: Sequence[float] = ()) -> float:
    """Time until the last of `durations` ends on `slots` parallel slots, `busy` of which are
    taken for the given times first (running trials' ETAs). 0 when nothing is left."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    busy = sorted(busy)
    if len(busy) > slots:  # more running than slots: the extra ones end before any new starts
        slots = len(busy)
    free = list(busy) + [0.0] * (slots - len(busy))
    heapq.heapify(free)
    for d in sorted(durations, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free, default=0.0)
