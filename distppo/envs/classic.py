"""Vector-observation envs (gymnasium classic control) for the MLP path.

No preprocessing: float32 observations, raw reward for training, and the reported return is
the plain episode return (one episode = one game, so GameStats closes a game at every done).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from distppo.envs.games import CARTPOLE_NO_VEL
from distppo.envs.types import GameStats
from distppo.errors import ConfigError


def make_classic_env(env_id: str, render: bool = False) -> tuple[gym.Env, GameStats]:
    """The env (float32 observations) and its GameStats."""
    render_mode = "rgb_array" if render else None
    if render:
        _require_pygame()
    if env_id == CARTPOLE_NO_VEL:
        env = gym.make("CartPole-v1", render_mode=render_mode)
        env = stats = GameStats(env)
        # CartPole obs = [x, x_dot, theta, theta_dot]; keep the positions only, so the
        # velocities must be inferred from memory (a POMDP that tells the LSTM from the MLP).
        env = SelectObs(env, keep=(0, 2))
    else:
        env = gym.make(env_id, render_mode=render_mode)
        env = stats = GameStats(env)
    return Float32Obs(env), stats


def _require_pygame() -> None:
    # Classic-control envs draw their frames with pygame, an optional gymnasium extra.
    try:
        import pygame  # noqa: F401
    except ImportError:
        raise ConfigError("videos of classic envs need pygame: pip install "
                          "'gymnasium[classic-control]', or drop --capture-video") from None


class SelectObs(gym.ObservationWrapper):
    """Keep only the listed entries of a 1-D Box observation."""

    def __init__(self, env: gym.Env, keep: tuple[int, ...]):
        super().__init__(env)
        self.keep = np.asarray(keep)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[self.keep], space.high[self.keep],
                                                dtype=space.dtype)

    def observation(self, observation):
        return observation[self.keep]  # [D] -> [len(keep)]


class Float32Obs(gym.ObservationWrapper):
    """Observations as float32 whatever the env's own dtype (a registered env may use float64)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low.astype(np.float32),
                                                space.high.astype(np.float32), dtype=np.float32)

    def observation(self, observation):
        return np.asarray(observation, dtype=np.float32)
