"""--grad-shards: a minibatch's gradient as the sum of its slices' gradients, each slice on a
fixed number of torch threads (ShardPlan.intra: 1 on a small node), side by side on a small
thread pool.

Why: a slice's gradient depends on its samples and its thread count only, never on how many
slices run at once, so --overlap's learner runs the slices one after another while the
runners sample and side by side once they have delivered (`ShardPool.start`), and a seed gives
the same numbers whichever happened. This module only cuts, schedules and adds: each slice's
loss is core/update.py's `minibatch_loss`, the function the one-pass update differentiates,
with its means taken over the whole minibatch (advantages normalised over the whole minibatch,
each slice's sums divided by the minibatch's size), so the slices' losses add up to the
minibatch's; the gradients are added in slice order. Only float rounding differs from one pass
(--grad-shards 1). A whole update is no faster sliced than in one pass on the same threads
(docs/benchmarks.md), so auto slices only where a learner hands over.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np
import torch

from distppo.core.ppo import as_floats
from distppo.placement.shards import ShardPlan


class ShardPool:
    """Runs a minibatch's slices, `width` at a time: the first on the calling thread, the
    others on pool threads; every slice on `plan.intra` torch threads."""

    def __init__(self, plan: ShardPlan):
        self.plan = plan
        self.width = 1
        self._handover, self._runners_done = 1, None
        self._pool = ThreadPoolExecutor(plan.count - 1, "grad-shard") if plan.count > 1 else None

    def start(self, threads: int, handover_threads: int = 0,
              runners_done: Optional[Callable[[], bool]] = None):
        """Before an update: slices at once on `threads` threads; with `runners_done`, on
        `handover_threads` from the first slice after runners_done() says so (--overlap: the
        runners have delivered, their cores are idle)."""
        self.width = self._slices(threads)
        self._handover, self._runners_done = self._slices(handover_threads), runners_done

    def _slices(self, threads: int) -> int:
        return max(1, min(self.plan.count, threads // self.plan.intra))

    def gradients(self, params: list, mb_size: int, mbenvinds: Optional[np.ndarray],
                  slice_loss: Callable) -> dict:
        """A minibatch's gradient as the sum of its slices', left in the parameters' .grad as
        loss.backward() leaves it; returns the minibatch's stats, the sum of the slices'.
        slice_loss(pos, envs) -> (loss, stats): the loss of the minibatch's positions `pos`
        (PPO-LSTM: of its envs `envs`), its means over the whole minibatch."""
        def slice_gradient(piece):
            loss, stats = slice_loss(*piece)
            return torch.autograd.grad(loss, params, allow_unused=True), as_floats(stats)

        results = self.map(slice_gradient, slices(self.plan.count, mb_size, mbenvinds))
        for i, param in enumerate(params):
            grads = [g[i] for g, _ in results if g[i] is not None]
            param.grad = None if not grads else sum(grads[1:], grads[0])
        return {k: sum(s[k] for _, s in results) for k in results[0][1]}

    def map(self, fn: Callable, items: list) -> list:
        """[fn(item)] in item order, `width` at a time."""
        out: list = []
        i = 0
        while i < len(items):
            if self._runners_done is not None and self._runners_done():
                self.width = max(self.width, self._handover)
                self._runners_done = None
            group = items[i:i + self.width]
            futures = [self._pool.submit(self._on_threads, fn, x) for x in group[1:]]
            out.append(self._on_threads(fn, group[0]))
            out.extend(f.result() for f in futures)
            i += len(group)
        return out

    def _on_threads(self, fn: Callable, item):
        # torch's thread count is per calling thread (OpenMP): a pool thread sets its own, once
        if torch.get_num_threads() != self.plan.intra:
            torch.set_num_threads(self.plan.intra)
        return fn(item)


def slices(count: int, mb_size: int, envs: Optional[np.ndarray]) -> list:
    """A minibatch cut into `count` slices: [(positions in the minibatch, the slice's envs)].
    Flat PPO (envs None): contiguous runs of positions. PPO-LSTM: whole env sequences; the
    minibatch is time-major over its envs ([T * E]), so a slice takes columns of [T, E]."""
    if envs is None:
        return [(torch.as_tensor(pos), None) for pos in np.array_split(np.arange(mb_size), count)]
    grid = np.arange(mb_size).reshape(-1, len(envs))  # [T*E] -> [T, E]
    return [(torch.as_tensor(grid[:, cols].ravel()), envs[cols])  # [T, e] -> [T*e]
            for cols in np.array_split(np.arange(len(envs)), count)]
