"""One small vector-env protocol that both backends implement, and the factory.

Semantics (shared/reference/hyperparameters.md sections 4 and 5):
- `done` is the training-level end (a life loss on Atari); `episodes` lists the *full games*
  that ended in this step, with their raw unclipped return over all lives.
- gym backend: same-step auto-reset, as gymnasium 0.29's SyncVectorEnv that CleanRL used (the
  returned obs of a done env is already the next start). EnvPool: auto-reset on the next
  step call (that reset step returns reward 0, done False, and counts as an agent step).
- `Episode.length` counts agent steps (vector-env step calls) of the game.
"""
from __future__ import annotations

import os
from typing import NamedTuple, Optional, Protocol

import cv2
import gymnasium as gym
import numpy as np

from distppo.config import ConfigError
from distppo.envs.games import resolve_env_id


class Episode(NamedTuple):
    env_index: int      # index of the sub-env within this vector env
    ret: float          # raw, unclipped return of the full game (all lives)
    length: int         # agent steps of the full game


class StepResult(NamedTuple):
    obs: np.ndarray     # [N, *obs_shape], obs_dtype (uint8 for Atari, float32 for classic)
    reward: np.ndarray  # [N] float32, the TRAINING reward (sign-clipped on Atari)
    done: np.ndarray    # [N] bool, training-level end (life loss on Atari, terminated|truncated)
    episodes: list[Episode]  # full games that ended in this step


class VecEnv(Protocol):
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int

    def reset(self) -> np.ndarray: ...            # [N, *obs_shape]
    def step(self, actions: np.ndarray) -> StepResult: ...   # actions [N] int
    def close(self) -> None: ...


def make_vector_env(env_id: str, backend: str, num_envs: int, seed: int, frame_stack: int,
                    video_dir: Optional[str] = None) -> VecEnv:
    """`num_envs` envs; sub-env i is seeded with seed + i on both backends (CleanRL's rule).

    `frame_stack` applies to Atari only (4 for ppo, 1 for ppo_lstm); classic envs ignore it.
    `video_dir`: record every full game of sub-env 0 as `<video_dir>/episode-<k>.mp4`.
    """
    if num_envs < 1 or frame_stack < 1:
        raise ConfigError(f"num_envs and frame_stack must be >= 1, got {num_envs}, {frame_stack}")
    env = _make(resolve_env_id(env_id, backend), backend, num_envs, seed, frame_stack, video_dir)
    fault_at = os.environ.get(FAULT_VARIABLE)
    return FaultAfter(env, int(fault_at)) if fault_at else env


FAULT_VARIABLE = "DISTPPO_INJECT_ENV_ERROR"


class FaultAfter:
    """Fault injection for resilience tests: with DISTPPO_INJECT_ENV_ERROR=N set in a
    process, its vector envs raise at step N, as a broken ROM or emulator would."""

    def __init__(self, env: VecEnv, steps: int):
        self.env, self.steps, self.count = env, steps, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions: np.ndarray) -> StepResult:
        self.count += 1
        if self.count >= self.steps:
            raise RuntimeError(f"emulator error injected at step {self.count} ({FAULT_VARIABLE})")
        return self.env.step(actions)


def _make(resolved, backend: str, num_envs: int, seed: int, frame_stack: int,
          video_dir: Optional[str]) -> VecEnv:
    if backend == "envpool":
        from distppo.envs.atari_envpool import EnvPoolVecEnv

        video = VideoRecorder(video_dir, fps=15) if video_dir else None
        return EnvPoolVecEnv(resolved.backend_id, num_envs, seed, frame_stack, video)
    if resolved.kind == "atari":
        from distppo.envs.atari_gym import make_atari_gym_env

        envs = [make_atari_gym_env(resolved.backend_id, frame_stack,
                                   render=bool(video_dir) and i == 0) for i in range(num_envs)]
        fps = 15  # one video frame per agent step = 4 emulator frames at 60 Hz
    else:
        from distppo.envs.classic import make_classic_env

        envs = [make_classic_env(resolved.backend_id, render=bool(video_dir) and i == 0)
                for i in range(num_envs)]
        fps = envs[0][0].metadata.get("render_fps") or 30
    video = VideoRecorder(video_dir, fps=fps) if video_dir else None
    return GymVecEnv(envs, seed, video)


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
        return obs, reward, terminated, truncated, info


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


class VideoRecorder:
    """Writes RGB frames to `<folder>/episode-<k>.mp4`, one file per full game."""

    def __init__(self, folder: str, fps: float):
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.fps = float(fps)
        self.episode = 0
        self._writer: Optional[cv2.VideoWriter] = None

    def add(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if frame.ndim == 4:   # EnvPool renders [1, H, W, 3]
            frame = frame[0]  # [1, H, W, 3] -> [H, W, 3]
        if self._writer is None:
            path = os.path.join(self.folder, f"episode-{self.episode}.mp4")
            h, w = frame.shape[:2]
            self._writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (w, h))
            if not self._writer.isOpened():
                raise RuntimeError(f"OpenCV cannot write {path} with the mp4v codec")
        self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))

    def end_episode(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None
            self.episode += 1

    def close(self) -> None:
        """Closes (keeps) the partial video of an unfinished game."""
        self.end_episode()
