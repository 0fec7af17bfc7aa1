"""Atari on ale-py's own C++ vector env (`gymnasium.make_vec(..., vectorization_mode=
"vector_entry_point")`, ale_py.vector_env.AtariVectorEnv), with the semantics of the gym path.

The C++ side does noops, frame skip with max-pool, grey, INTER_AREA resize and FIRE on reset,
in threads. We take the rest into our hands where its built-in options differ from CleanRL's
ppo_atari.py chain (shared/reference/hyperparameters.md 4a):
- `episodic_life=True` in ale-py 0.12 resets the *whole game* at a life loss (lives back to
  full), so every game would last one life. We use `life_loss_info=True` instead: terminated
  at a life loss, the game goes on, and the true game over is a new game starting (its
  episode frame counter starts again).
- Rewards come unclipped (`reward_clipping=False`): we sign-clip them for training and sum the
  raw ones for the reported return, the full-game score across all lives.
- Frames are stacked here (`stack_num=1` in C++): at a game start and after every training
  done the stack is filled with the newest frame, as the gym chain's FrameStack does on its
  (pseudo-)resets; ale-py's own stack would start with zero frames.
- Auto-reset in the same step (`SameStep`), as the gym backend: a done env's obs already
  starts the next game.
What remains different is listed in docs/semantics.md (no NOOP/FIRE after a life loss, grey
before the resize, one FIRE step on reset).
"""
from __future__ import annotations

import numpy as np

from distppo.envs.types import Episode, StepResult

# AtariVectorEnv's options, spelled out so none depends on ale-py's defaults.
ALE_OPTIONS = dict(
    frameskip=4, maxpool=True, noop_max=30, use_fire_reset=True, repeat_action_probability=0.0,
    full_action_space=False, max_num_frames_per_episode=108_000, img_height=84, img_width=84,
    grayscale=True, stack_num=1, episodic_life=False, life_loss_info=True,
    reward_clipping=False, autoreset_mode="SameStep")


class AleVecEnv:
    """ale-py's vector env of `num_envs` envs, env i seeded with seed + i (CleanRL's rule)."""

    def __init__(self, ale_id: str, num_envs: int, seed: int, frame_stack: int,
                 max_episode_steps: int | None = 27_000, num_threads: int = 0):
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        # The time limit counts emulator frames (4 per agent step); 0 means none.
        frames = 4 * max_episode_steps if max_episode_steps else 0
        self.env = gym.make_vec(ale_id, num_envs=num_envs, vectorization_mode="vector_entry_point",
                                num_threads=num_threads,
                                **{**ALE_OPTIONS, "max_num_frames_per_episode": frames})
        self.num_envs, self.seed = num_envs, seed
        self.obs_shape = (frame_stack, 84, 84)
        self.obs_dtype = np.dtype(np.uint8)
        self.num_actions = int(self.env.single_action_space.n)
        self._seeded = False
        self._stack = np.zeros((num_envs, *self.obs_shape), dtype=np.uint8)
        self._game_return = np.zeros(num_envs, dtype=np.float64)
        self._game_length = np.zeros(num_envs, dtype=np.int64)
        # [N] raw reward of the last step and emulator frames into the current game; for checks
        self.raw_reward = np.zeros(num_envs, dtype=np.float32)
        self.episode_frames = np.zeros(num_envs, dtype=np.int64)

    def reset(self) -> np.ndarray:
        # Seed once, at the first reset (CleanRL: envs.reset(seed=args.seed)).
        obs, info = self.env.reset(seed=None if self._seeded else self.seed)
        self._seeded = True
        self.episode_frames[:] = info["episode_frame_number"]
        self._game_return[:] = 0.0
        self._game_length[:] = 0
        self._stack[:] = obs  # [N, 1, 84, 84] broadcast over the k stack slots
        return self._stack.copy()  # [N, k, 84, 84]

    def step(self, actions: np.ndarray) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(
            np.asarray(actions, dtype=np.int64))
        # Sync mode (batch_size = num_envs) returns envs in order.
        assert np.array_equal(info["env_id"], np.arange(self.num_envs)), info["env_id"]
        self.raw_reward[:] = reward
        self._game_return += reward
        self._game_length += 1
        # A new game started in this step (SameStep auto-reset): its frame counter went down.
        game_over = info["episode_frame_number"] < self.episode_frames
        self.episode_frames[:] = info["episode_frame_number"]
        done = terminated | truncated
        episodes = [Episode(int(i), float(self._game_return[i]), int(self._game_length[i]))
                    for i in np.flatnonzero(game_over)]
        self._game_return[game_over] = 0.0
        self._game_length[game_over] = 0
        self._stack[:, :-1] = self._stack[:, 1:]   # [N, k, 84, 84]: drop the oldest frame
        self._stack[:, -1] = obs[:, 0]             # [N, 1, 84, 84] -> [N, 84, 84]
        self._stack[done] = obs[done]              # a done refills the stack, as FrameStack
        return StepResult(self._stack.copy(), np.sign(reward).astype(np.float32), done, episodes)

    def close(self) -> None:
        self.env.close()
