"""Atari on EnvPool with the observation/reward/episode semantics of the gym path.

EnvPool does the whole preprocessing chain in C++ (noops, frame skip + max-pool, grey,
INTER_AREA resize, FIRE reset, episodic life, sign clipping, frame stack); see
shared/reference/hyperparameters.md 4b for the options and where it differs from the gym path.
What we add is the reported return: EnvPool's `info["reward"]` is the raw reward and
`info["terminated"]` the true game over, so raw returns are summed per game over all lives,
as CleanRL's envpool scripts do (their RecordEpisodeStatistics wrapper).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from distppo.envs.types import Episode, StepResult
from distppo.envs.video import VideoRecorder


class EnvPoolVecEnv:
    """Synchronous EnvPool (batch_size = num_envs); auto-reset happens on the NEXT step call."""

    def __init__(self, v5_id: str, num_envs: int, seed: int, frame_stack: int,
                 max_episode_steps: int, video: Optional[VideoRecorder] = None,
                 num_threads: int = 0):
        import envpool

        # EnvPool seeds env i with seed + i itself, which is CleanRL's rule. Its time limit
        # counts agent steps (Step calls) since the game's reset, not frames and not per life.
        self.env = envpool.make(v5_id, env_type="gymnasium", num_envs=num_envs,
                                episodic_life=True, reward_clip=True, seed=seed,
                                stack_num=frame_stack, max_episode_steps=max_episode_steps,
                                num_threads=num_threads,
                                **({"render_mode": "rgb_array"} if video else {}))
        self.num_envs = num_envs
        self.obs_shape = tuple(self.env.observation_space.shape)   # (k, 84, 84)
        self.obs_dtype = np.dtype(self.env.observation_space.dtype)
        self.num_actions = int(self.env.action_space.n)
        self.video = video
        self._last_done = np.zeros(num_envs, dtype=bool)   # EnvPool resets these on the next call
        self._game_return = np.zeros(num_envs, dtype=np.float64)
        self._game_length = np.zeros(num_envs, dtype=np.int64)
        # ppo_atari_envpool.py's RecordEpisodeStatistics: float32 raw return, cleared at a
        # true game over only
        self._cleanrl_return = np.zeros(num_envs, dtype=np.float32)
        # [N] raw (unclipped) reward of the last step (info["reward"]); for checks only.
        self.raw_reward = np.zeros(num_envs, dtype=np.float32)

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset()
        self._last_done[:] = False
        self._cleanrl_return[:] = 0.0
        self._game_return[:] = 0.0
        self._game_length[:] = 0
        if self.video:
            self.video.add(self.env.render())
        return obs  # [N, k, 84, 84] uint8

    def step(self, actions: np.ndarray) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(
            np.asarray(actions, dtype=np.int32))
        # Sync mode returns envs in order; a mismatch would silently mix up envs' games.
        assert np.array_equal(info["env_id"], np.arange(self.num_envs)), info["env_id"]
        self.raw_reward[:] = info["reward"]
        self._game_return += info["reward"]
        self._game_length += 1   # the reset step after a done counts, as in CleanRL's scripts
        # `terminated` here is per life (episodic_life); info["terminated"] is the true game
        # over. A time-limit truncation also ends the game (hyperparameters.md section 5, X).
        game_over = info["terminated"].astype(bool) | truncated
        episodes = [Episode(int(i), float(self._game_return[i]), int(self._game_length[i]))
                    for i in np.flatnonzero(game_over)]
        self._game_return[game_over] = 0.0
        self._game_length[game_over] = 0
        if self.video:
            self.video.add(self.env.render())
            if game_over[0]:
                self.video.end_episode()
        done = terminated | truncated
        autoreset, self._last_done = self._last_done, done
        return StepResult(obs, reward.astype(np.float32), done, episodes, autoreset,
                          self._cleanrl_logged(info, done))

    def _cleanrl_logged(self, info: dict, done: np.ndarray) -> list[tuple[int, float]]:
        """The games ppo_atari_envpool.py logs at this step, valued as it values them.

        Its return sums info["reward"] until info["terminated"] (a true game over) and is
        logged at a done with info["lives"] == 0. So a game cut by the time limit with lives
        left is not logged and its score runs on into the next logged game; a game without
        a lives counter (Pong) is logged at every done, truncation included.
        """
        self._cleanrl_return += info["reward"]
        logged = [(int(i), float(self._cleanrl_return[i]))
                  for i in np.flatnonzero(done & (info["lives"] == 0))]
        self._cleanrl_return[info["terminated"].astype(bool)] = 0.0
        return logged

    def close(self) -> None:
        self.env.close()
        if self.video:
            self.video.close()
