"""One Atari env on gymnasium + ale-py with CleanRL's wrapper chain (ppo_atari.py, make_env).

Built from the libraries CleanRL builds it from: the five Atari wrappers come from
`stable_baselines3.common.atari_wrappers` (CleanRL imports them from there), resize and frame
stack are gymnasium's. Two pieces are ours: GameStats (types.py) sits innermost where CleanRL
has gymnasium's RecordEpisodeStatistics, and the grey conversion calls cv2 directly, because
gymnasium 1.x's GrayscaleObservation uses other weights than the cv2.cvtColor of gymnasium
0.29.1 that CleanRL ran. Order, innermost to outermost: shared/reference/hyperparameters.md 4a.
"""
from __future__ import annotations

import cv2
import gymnasium as gym
import numpy as np

from distppo.envs.games import to_v5
from distppo.envs.types import GameStats

FRAME_SKIP = 4   # emulator frames per agent step (MaxAndSkipEnv)


def make_atari_gym_env(gym_id: str, frame_stack: int, max_episode_steps: int = 27_000,
                       render: bool = False) -> tuple[gym.Env, GameStats]:
    """The wrapped env and its GameStats (which the vector env reads finished games from).

    `max_episode_steps` in agent steps; the ALE counts emulator frames (reset no-ops
    included), so the limit it gets is 4 frames per agent step: 27,000 -> the v4 ids' 108,000.
    """
    import ale_py
    from stable_baselines3.common.atari_wrappers import (
        ClipRewardEnv,
        EpisodicLifeEnv,
        FireResetEnv,
        MaxAndSkipEnv,
        NoopResetEnv,
    )

    gym.register_envs(ale_py)  # gymnasium 1.x does not find ale-py's ids by itself
    # The kwargs are every one a NoFrameskip-v4 id registers (ale_py/registration.py), so the
    # env is the v4 one whichever registered id of the ROM builds it (v4_or_v5_id).
    env = gym.make(v4_or_v5_id(gym_id), frameskip=1, repeat_action_probability=0.0,
                   full_action_space=False,
                   max_num_frames_per_episode=FRAME_SKIP * max_episode_steps,
                   render_mode="rgb_array" if render else None)
    # Below EpisodicLife, so the raw return spans all lives (hyperparameters.md section 5).
    env = stats = GameStats(env)
    env = NoopResetEnv(env, noop_max=30)
    env = MaxAndSkipEnv(env, skip=FRAME_SKIP)
    env = EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    env = ClipRewardEnv(env)
    env = gym.wrappers.ResizeObservation(env, (84, 84))   # cv2 INTER_AREA, as gymnasium 0.29
    env = gym.wrappers.TransformObservation(env, grey, gym.spaces.Box(0, 255, (84, 84), np.uint8))
    env = gym.wrappers.FrameStackObservation(env, frame_stack)  # [84, 84] -> [k, 84, 84]
    return env, stats


def v4_or_v5_id(gym_id: str) -> str:
    """The NoFrameskip-v4 id where ale-py registers it, else the `ALE/<Game>-v5` id of the same
    ROM (ale-py 0.12 registers v4 ids for its legacy game list only, which lacks one of the 57
    games). The two specs differ in their kwargs alone, which make_atari_gym_env sets; neither
    has a TimeLimit (max_episode_steps None)."""
    if gym_id in gym.registry:
        return gym_id
    return f"ALE/{to_v5(gym_id)}"


def grey(observation: np.ndarray) -> np.ndarray:
    """RGB -> grey with cv2, as gymnasium 0.29's GrayScaleObservation: [84, 84, 3] -> [84, 84]."""
    return cv2.cvtColor(observation, cv2.COLOR_RGB2GRAY)
