"""Reproducibility is code: every seed derives from one function of (base seed, runner, env)."""
from __future__ import annotations

import random

import numpy as np
import torch


def env_seed(base_seed: int, runner_index: int, envs_per_runner: int) -> int:
    """Seed of sub-env 0 of runner `runner_index`; its sub-env i gets this + i.

    So global env j = runner * envs_per_runner + i is seeded base_seed + j, whatever the number
    of runners: one runner reproduces CleanRL's `seed + i`, and splitting the envs over more
    runners does not change any env's seed.
    """
    return base_seed + runner_index * envs_per_runner


def seed_everything(seed: int) -> None:
    """Seed python's random, numpy's global generator and torch (CPU and all GPUs)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
