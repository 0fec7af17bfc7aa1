"""make_vector_env: the one place a VecEnv is built, for every backend and env kind."""
from __future__ import annotations

from typing import Optional

from distppo.envs.games import (  # noqa: F401 - the limit's names, imported from here too
    DEFAULT_MAX_EPISODE_STEPS,
    NO_ALE_VIDEO,
    ResolvedEnv,
    episode_limit,
    resolve_env_id,
)
from distppo.envs.types import VecEnv
from distppo.envs.video import VideoRecorder
from distppo.errors import ConfigError
from distppo.testing import faults


def frame_stack(algo: str) -> int:
    """CleanRL stacks 4 frames for the CNN and feeds the LSTM 1 frame."""
    return 1 if algo == "ppo_lstm" else 4


def make_vector_env(env_id: str, backend: str, num_envs: int, seed: int, frame_stack: int,
                    video_dir: Optional[str] = None,
                    max_episode_steps: Optional[int] = None, num_threads: int = 0) -> VecEnv:
    """`num_envs` envs; sub-env i is seeded with seed + i on both backends (CleanRL's rule).

    `frame_stack` applies to Atari only (4 for ppo, 1 for ppo_lstm); classic envs ignore it.
    `video_dir`: record every full game of sub-env 0 as `<video_dir>/episode-<k>.mp4`.
    `max_episode_steps`: Atari time limit in agent steps (None: DEFAULT_MAX_EPISODE_STEPS).
    `num_threads`: EnvPool's / ale-py's worker threads (0: theirs, one per core); same numbers
    at any count (synchronous batches, every env seeded on its own).
    """
    if num_envs < 1 or frame_stack < 1:
        raise ConfigError(f"num_envs and frame_stack must be >= 1, got {num_envs}, {frame_stack}")
    limit = episode_limit(env_id, backend, max_episode_steps)
    env = _make(resolve_env_id(env_id, backend), backend, num_envs, seed, frame_stack, video_dir,
                limit, num_threads)
    return faults.wrap_env(env)


def _make(resolved: ResolvedEnv, backend: str, num_envs: int, seed: int, frame_stack: int,
          video_dir: Optional[str], limit: Optional[int], num_threads: int = 0) -> VecEnv:
    if backend == "envpool":
        from distppo.envs.atari_envpool import EnvPoolVecEnv

        video = VideoRecorder(video_dir, fps=15) if video_dir else None
        return EnvPoolVecEnv(resolved.backend_id, num_envs, seed, frame_stack, limit, video,
                             num_threads)
    if backend == "ale":
        from distppo.envs.atari_ale import AleVecEnv

        if video_dir:
            raise ConfigError(NO_ALE_VIDEO)
        return AleVecEnv(resolved.backend_id, num_envs, seed, frame_stack, limit, num_threads)
    from distppo.envs.gym_vector import GymVecEnv

    if resolved.kind == "atari":
        from distppo.envs.atari_gym import make_atari_gym_env

        envs = [make_atari_gym_env(resolved.backend_id, frame_stack, limit,
                                   render=bool(video_dir) and i == 0) for i in range(num_envs)]
        fps = 15  # one video frame per agent step = 4 emulator frames at 60 Hz
    else:
        from distppo.envs.classic import make_classic_env

        envs = [make_classic_env(resolved.backend_id, render=bool(video_dir) and i == 0)
                for i in range(num_envs)]
        fps = envs[0][0].metadata.get("render_fps") or 30
    video = VideoRecorder(video_dir, fps=fps) if video_dir else None
    return GymVecEnv(envs, seed, video)
