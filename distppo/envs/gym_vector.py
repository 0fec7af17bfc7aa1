"""Gymnasium sub-envs stepped in sequence, with same-step auto-reset, as one VecEnv."""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

from distppo.envs.types import Episode, GameStats, StepResult
from distppo.envs.video import VideoRecorder


class GymVecEnv:
    """Sub-envs stepped in sequence with same-step auto-reset (gymnasium 0.29 SyncVectorEnv).

    Written out rather than gymnasium 1.x's SyncVectorEnv, whose default autoreset mode is
    NEXT_STEP; CleanRL's learner saw SAME_STEP semantics.
    """

    def __init__(self, envs: list[tuple[gym.Env, GameStats]], seed: int,
                 video: Optional["VideoRecorder"] = None):
        self.envs = [env for env, _ in envs]
        self.stats = [stats for _, stats in envs]
        self.num_envs = len(self.envs)
        space = self.envs[0].observation_space
        self.obs_shape = tuple(space.shape)
        self.obs_dtype = np.dtype(space.dtype)
        self.num_actions = int(self.envs[0].action_space.n)
        self.seed = seed
        self.video = video
        self._seeded = False
        self._steps = np.zeros(self.num_envs, dtype=np.int64)   # agent steps of current game
        # [N] raw (unclipped) reward of the last step call, auto-reset included; for checks
        # and diagnostics, not part of the VecEnv protocol.
        self.raw_reward = np.zeros(self.num_envs, dtype=np.float32)

    def reset(self) -> np.ndarray:
        # Seed once, at the first reset (CleanRL: envs.reset(seed=args.seed)); later resets
        # continue each env's own random stream.
        seeds = [self.seed + i if not self._seeded else None for i in range(self.num_envs)]
        self._seeded = True
        obs = [env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)]
        for stats in self.stats:
            stats.finished.clear()
        self._steps[:] = 0
        if self.video:
            self.video.add(self.envs[0].render())
        return np.stack(obs)  # N x [*obs_shape] -> [N, *obs_shape]

    def step(self, actions: np.ndarray) -> StepResult:
        obs = np.empty((self.num_envs, *self.obs_shape), dtype=self.obs_dtype)
        reward = np.zeros(self.num_envs, dtype=np.float32)
        done = np.zeros(self.num_envs, dtype=bool)
        episodes: list[Episode] = []
        for i, (env, stats) in enumerate(zip(self.envs, self.stats)):
            raw_before = stats.raw_total
            obs[i], reward[i], terminated, truncated, _ = env.step(int(actions[i]))
            self._steps[i] += 1
            recording = self.video is not None and i == 0
            if recording:
                self.video.add(env.render())
            done[i] = terminated or truncated
            if done[i]:
                obs[i] = env.reset()[0]
            for ret in stats.finished:
                episodes.append(Episode(i, ret, int(self._steps[i])))
                self._steps[i] = 0
            if recording and stats.finished:
                self.video.end_episode()
            if recording and done[i]:
                self.video.add(env.render())
            stats.finished.clear()
            self.raw_reward[i] = stats.raw_total - raw_before
        return StepResult(obs, reward, done, episodes)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.video:
            self.video.close()
