"""One Atari env on gymnasium + ale-py with CleanRL's wrapper chain (ppo_atari.py, make_env).

Gymnasium 1.x dropped the Atari wrappers CleanRL imported from stable_baselines3, so they are
re-written here, step for step after SB3's `common/atari_wrappers.py` (v2.x) that CleanRL
used; order innermost to outermost is shared/reference/hyperparameters.md section 4a.
"""
from __future__ import annotations

import collections

import cv2
import gymnasium as gym
import numpy as np

from distppo.envs.types import GameStats

NOOP, FIRE = 0, 1


def make_atari_gym_env(gym_id: str, frame_stack: int, max_episode_steps: int = 27_000,
                       render: bool = False) -> tuple[gym.Env, GameStats]:
    """The wrapped env and its GameStats (which the vector env reads finished games from).

    `max_episode_steps` in agent steps; the ALE counts emulator frames (reset no-ops
    included), so the limit it gets is 4 frames per agent step: 27,000 -> the v4 ids' 108,000.
    """
    import ale_py

    gym.register_envs(ale_py)  # gymnasium 1.x no longer finds ale-py's ids by itself
    env = gym.make(gym_id, frameskip=1, repeat_action_probability=0.0,
                   full_action_space=False, max_num_frames_per_episode=4 * max_episode_steps,
                   render_mode="rgb_array" if render else None)
    # Below EpisodicLife, so the raw return spans all lives (hyperparameters.md section 5).
    env = stats = GameStats(env)
    env = NoopReset(env, noop_max=30)
    env = MaxAndSkip(env, skip=4)
    env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    env = ClipReward(env)
    env = ResizeGrey(env, size=84)
    env = FrameStack(env, k=frame_stack)
    return env, stats


def _ale(env: gym.Env):
    return env.unwrapped.ale


class NoopReset(gym.Wrapper):
    """On a real reset, 1..noop_max NOOP frames drawn from the env's np_random (DQN Nature)."""

    def __init__(self, env: gym.Env, noop_max: int = 30):
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        noops = self.unwrapped.np_random.integers(1, self.noop_max + 1)
        for _ in range(noops):
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeat the action `skip` frames, sum rewards, max-pool the last two frames."""

    def __init__(self, env: gym.Env, skip: int = 4):
        super().__init__(env)
        self._skip = skip
        # [2, 210, 160, 3]; like SB3 it is not cleared, so an early stop reuses stale frames
        self._obs_buffer = np.zeros((2, *env.observation_space.shape), dtype=np.uint8)

    def step(self, action):
        total_reward = 0.0
        terminated = truncated = False
        for i in range(self._skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i == self._skip - 2:
                self._obs_buffer[0] = obs
            if i == self._skip - 1:
                self._obs_buffer[1] = obs
            total_reward += float(reward)
            if terminated or truncated:
                break
        max_frame = self._obs_buffer.max(axis=0)  # [2, H, W, 3] -> [H, W, 3]
        return max_frame, total_reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """Training episodes end at a life loss; the game itself only resets at game over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = _ale(self.env).lives()
        # `0 < lives` because some games signal game over before the counter reaches 0.
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            # Continue the same game: one NOOP agent step past the lost life.
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = _ale(self.env).lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2) after every reset: games that wait for FIRE would stall."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        assert meanings[FIRE] == "FIRE" and len(meanings) >= 3, meanings

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, _ = self.env.step(FIRE)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, _ = self.env.step(2)
        if terminated or truncated:
            self.env.reset(**kwargs)
        return obs, {}


class ClipReward(gym.RewardWrapper):
    """Training reward = sign(raw reward); GameStats below keeps the raw score."""

    def reward(self, reward):
        return float(np.sign(float(reward)))


class ResizeGrey(gym.ObservationWrapper):
    """Resize RGB with INTER_AREA, then RGB -> grey: CleanRL's order (resize first)."""

    def __init__(self, env: gym.Env, size: int = 84):
        super().__init__(env)
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def observation(self, observation):
        small = cv2.resize(observation, (self.size, self.size), interpolation=cv2.INTER_AREA)
        return cv2.cvtColor(small, cv2.COLOR_RGB2GRAY)  # [84, 84, 3] -> [84, 84]


class FrameStack(gym.Wrapper):
    """Last k frames, channel-first; a reset fills the stack with the first frame."""

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        self.frames: collections.deque = collections.deque(maxlen=k)
        h, w = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (k, h, w), np.uint8)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.frames.maxlen):
            self.frames.append(obs)
        return self._obs(), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return self._obs(), reward, terminated, truncated, info

    def _obs(self) -> np.ndarray:
        return np.stack(self.frames)  # k x [84, 84] -> [k, 84, 84]
