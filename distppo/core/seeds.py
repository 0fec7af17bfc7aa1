"""Reproducibility is code: every seed derives from one function of (base seed, runner, env)."""
from __future__ import annotations

import random

import numpy as np
import torch


def env_seed(base_seed: int, runner_index: int, envs_per_runner: int, num_runners: int = 1,
             incarnation: int = 0) -> int:
    """Seed of sub-env 0 of runner `runner_index`; its sub-env i gets this + i.

    So global env j = runner * envs_per_runner + i is seeded base_seed + j, whatever the number
    of runners: one runner reproduces CleanRL's `seed + i`, and splitting the envs over more
    runners does not change any env's seed.

    A runner whose process died is rebuilt by Ray from a fresh reset (incarnation k >= 1 of
    it). Reusing its first seeds would replay the noop starts and sticky-action draws of the
    run's first games; instead incarnation k takes the seeds that runner `k * num_runners + r`
    would have, a block of num_envs seeds per incarnation that no env of this run used before.
    """
    return base_seed + (incarnation * num_runners + runner_index) * envs_per_runner


def set_torch_deterministic(on: bool) -> None:
    """CleanRL's --torch-deterministic, all of it: `torch.backends.cudnn.deterministic = on`.
    A process flag: every process that runs the model sets it for itself (the loop's, each
    learner's and env runner's)."""
    torch.backends.cudnn.deterministic = on


def seed_everything(seed: int) -> None:
    """Seed python's random, numpy's global generator and torch (CPU and all GPUs)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class CleanRLShuffle:
    """CleanRL's minibatch index stream, for --exact-replay: each iteration starts from
    `np.arange(n)` and each epoch shuffles that same array in place with `np.random.shuffle`
    (so an epoch's order builds on the last one's), on numpy's legacy generator seeded as
    `np.random.seed(seed)` seeds the global one. A stand-in for the learner's
    np.random.Generator: `permutation(n)` is the next epoch's order of n indices."""

    def __init__(self, seed: int):
        self.random = np.random.RandomState(seed)  # the stream np.random.seed(seed) starts
        self.bit_generator = self  # the learner's checkpoint reads and sets .bit_generator.state
        self.inds: dict[int, np.ndarray] = {}

    def start_iteration(self) -> None:
        """A new iteration: CleanRL's b_inds (envinds for PPO-LSTM) is a fresh np.arange."""
        self.inds.clear()

    def permutation(self, n: int) -> np.ndarray:
        inds = self.inds.setdefault(n, np.arange(n))
        self.random.shuffle(inds)
        return inds.copy()

    @property
    def state(self) -> dict:
        return self.random.get_state(legacy=False)

    @state.setter
    def state(self, value: dict) -> None:
        self.random.set_state(value)
