"""What every vector env hands the sampler: the VecEnv protocol, StepResult and Episode.

Semantics (shared/reference/hyperparameters.md sections 4 and 5):
- `done` is the training-level end (a life loss on Atari); `episodes` lists the *full games*
  that ended in this step, with their raw unclipped return over all lives.
- gym backend: same-step auto-reset, as gymnasium 0.29's SyncVectorEnv that CleanRL used (the
  returned obs of a done env is already the next start; gymnasium 1.x: AutoresetMode.SAME_STEP).
  EnvPool: auto-reset on the next step call (that reset step returns reward 0, done False, and
  counts as an agent step).
- `Episode.length` counts agent steps (vector-env step calls) of the game.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Protocol

import gymnasium as gym
import numpy as np


class Episode(NamedTuple):
    env_index: int      # index of the sub-env within this vector env
    ret: float          # raw, unclipped return of the full game (all lives)
    length: int         # agent steps of the full game


class StepResult(NamedTuple):
    obs: np.ndarray     # [N, *obs_shape], obs_dtype (uint8 for Atari, float32 for classic)
    reward: np.ndarray  # [N] float32, the TRAINING reward (sign-clipped on Atari)
    done: np.ndarray    # [N] bool, training-level end (life loss on Atari, terminated|truncated)
    episodes: list[Episode]  # full games that ended in this step
    # [N] bool, next-step auto-reset envs only (EnvPool): this call reset the env instead of
    # stepping it (the action was ignored, reward 0); `obs` is the first of a new life or game.
    # None: the env resets in the same step as the done (gym), so no call is a reset.
    autoreset: Optional[np.ndarray] = None
    # EnvPool only: (env index, return) of each game ppo_atari_envpool.py would log at this
    # step, by its own bookkeeping (atari_envpool.py); None on other backends.
    envpool_logged: Optional[list[tuple[int, float]]] = None


class VecEnv(Protocol):
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int

    def reset(self) -> np.ndarray: ...            # [N, *obs_shape]
    def step(self, actions: np.ndarray) -> StepResult: ...   # actions [N] int
    def close(self) -> None: ...


class GameStats(gym.Wrapper):
    """Innermost gym wrapper: the raw return of the current *game*.

    It sits below EpisodicLife, so only a true game over or truncation closes a game (like
    gymnasium's RecordEpisodeStatistics in CleanRL). Finished games queue up in `finished`
    for the vector env to drain, so a game that ends inside a reset (e.g. the frame limit hit
    during EpisodicLife's NOOP step) is still reported, where CleanRL's info dict dropped it.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.game_return = 0.0
        self.raw_total = 0.0     # raw reward summed over the env's lifetime (never cleared)
        self.games = 0           # games finished over the env's lifetime (never cleared)
        self.finished: list[float] = []

    def reset(self, **kwargs):
        self.game_return = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_return += float(reward)
        self.raw_total += float(reward)
        if terminated or truncated:
            self.finished.append(self.game_return)
            self.games += 1
        return obs, reward, terminated, truncated, info
