"""gymnasium's SyncVectorEnv with same-step auto-reset, as one VecEnv with full-game returns."""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from distppo.envs.types import Episode, GameStats, StepResult
from distppo.envs.video import VideoRecorder


class GymVecEnv:
    """Sub-envs in one `SyncVectorEnv(autoreset_mode=SAME_STEP)`.

    SAME_STEP is gymnasium 0.29's behaviour, the SyncVectorEnv CleanRL's gym scripts ran: the
    observation returned with a done is already the first one of the next life or game (1.x
    defaults to NEXT_STEP). What we add: the finished games of each sub-env's GameStats, with
    their length in agent steps, and env 0's video.
    """

    def __init__(self, envs: list[tuple[gym.Env, GameStats]], seed: int,
                 video: Optional[VideoRecorder] = None):
        self.stats = [stats for _, stats in envs]
        subenvs = [env for env, _ in envs]
        if video is not None:
            subenvs[0] = RecordFrames(subenvs[0], self.stats[0], video)
        self.vec = SyncVectorEnv([lambda env=env: env for env in subenvs],
                                 autoreset_mode=AutoresetMode.SAME_STEP)
        self.num_envs = len(subenvs)
        space = self.vec.single_observation_space
        self.obs_shape = tuple(space.shape)
        self.obs_dtype = np.dtype(space.dtype)
        self.num_actions = int(self.vec.single_action_space.n)
        self.seed = seed
        self.video = video
        self._seeded = False
        self._steps = np.zeros(self.num_envs, dtype=np.int64)   # agent steps of current game
        # [N] raw (unclipped) reward of the last step call, auto-reset included; for checks
        # and diagnostics, not part of the VecEnv protocol.
        self.raw_reward = np.zeros(self.num_envs, dtype=np.float32)

    def reset(self) -> np.ndarray:
        # Seed once, at the first reset (CleanRL: envs.reset(seed=args.seed), env i gets
        # seed + i); later resets continue each env's own random stream.
        obs, _ = self.vec.reset(seed=None if self._seeded else self.seed)
        self._seeded = True
        for stats in self.stats:
            stats.finished.clear()
        self._steps[:] = 0
        return obs  # [N, *obs_shape]

    def step(self, actions: np.ndarray) -> StepResult:
        raw_before = np.array([s.raw_total for s in self.stats])
        obs, reward, terminated, truncated, _ = self.vec.step(np.asarray(actions))
        self._steps += 1
        episodes: list[Episode] = []
        for i, stats in enumerate(self.stats):
            for ret in stats.finished:   # a game ends at a done, or inside the reset after it
                episodes.append(Episode(i, ret, int(self._steps[i])))
                self._steps[i] = 0
            stats.finished.clear()
        self.raw_reward[:] = np.array([s.raw_total for s in self.stats]) - raw_before
        return StepResult(obs, reward.astype(np.float32), terminated | truncated, episodes)

    def close(self) -> None:
        self.vec.close()
        if self.video:
            self.video.close()


class RecordFrames(gym.Wrapper):
    """Env 0's rendered frames into the video: one per agent step and one per reset (the first
    frame of a life), a new file after each finished game."""

    def __init__(self, env: gym.Env, stats: GameStats, video: VideoRecorder):
        super().__init__(env)
        self.stats, self.video = stats, video
        self._games = stats.games

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self._frame()
        return out

    def step(self, action):
        out = self.env.step(action)
        self._frame()
        return out

    def _frame(self) -> None:
        self.video.add(self.env.render())
        if self.stats.games != self._games:
            self._games = self.stats.games
            self.video.end_episode()
