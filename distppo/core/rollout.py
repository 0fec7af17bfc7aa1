"""RolloutBatch: what an env runner hands a learner for one iteration.

Arrays are numpy, time-major [T, N, ...]; observations keep the env's dtype (uint8 on Atari),
so no float copy ever crosses a process boundary. The batch's `meta` is what the training loop
needs without the arrays: on Ray the arrays go from the runner to the learners through the
object store and never pass through the loop, which only receives the meta.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RolloutMeta:
    num_steps: int
    num_envs: int
    episode_returns: tuple = ()  # raw full-game returns finished in this rollout
    episode_lengths: tuple = ()  # agent steps of those games
    episode_envs: tuple = ()     # the env index (within this batch) of each of those games
    # EnvPool only: (step, env index, return) of each game ppo_atari_envpool.py would log
    # (telemetry/stats.py ReferenceReturns); None on other backends
    envpool_logged: tuple | None = None
    t_env_s: float = 0.0         # seconds spent stepping envs
    t_infer_s: float = 0.0       # seconds spent in policy forward passes
    weights_version: int = -1    # version of the weights that sampled this batch
    runner_index: int = 0

    @staticmethod
    def concat(metas: list["RolloutMeta"]) -> "RolloutMeta":
        """The metas of runners' batches as one, envs numbered on in the given order."""
        offsets = np.cumsum([0] + [m.num_envs for m in metas])
        logged = None
        if any(m.envpool_logged is not None for m in metas):
            logged = tuple(sorted((s, e + off, r) for m, off in zip(metas, offsets)
                                  for s, e, r in m.envpool_logged or ()))
        return RolloutMeta(
            num_steps=metas[0].num_steps, num_envs=int(offsets[-1]),
            episode_returns=tuple(r for m in metas for r in m.episode_returns),
            episode_lengths=tuple(n for m in metas for n in m.episode_lengths),
            episode_envs=tuple(int(e + off) for m, off in zip(metas, offsets)
                               for e in m.episode_envs),
            envpool_logged=logged,
            t_env_s=max(m.t_env_s for m in metas), t_infer_s=max(m.t_infer_s for m in metas),
            weights_version=min(m.weights_version for m in metas))


@dataclass
class RolloutBatch:
    obs: np.ndarray          # [T, N, *obs_shape], uint8 (Atari) or float32 (vector obs)
    actions: np.ndarray      # [T, N] int64
    logprobs: np.ndarray     # [T, N] float32
    values: np.ndarray       # [T, N] float32
    rewards: np.ndarray      # [T, N] float32, training reward (clipped on Atari)
    dones: np.ndarray        # [T, N] bool, flag that arrived with obs[t]
    next_value: np.ndarray   # [N] float32, bootstrap value of the observation after step T-1
    next_done: np.ndarray    # [N] bool
    lstm_state: tuple | None = None  # (h, c), each [1, N, H] float32: state at rollout start
    # [T, N] bool or None (= all): False at EnvPool's reset steps under PPO-LSTM's exact resets,
    # which the LSTM runs over but the loss leaves out (sampler.py)
    valid: np.ndarray | None = None
    meta: RolloutMeta = field(default=None)  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.meta is None:
            self.meta = RolloutMeta(self.num_steps, self.num_envs)
        self.validate()

    @property
    def num_steps(self) -> int:
        return self.obs.shape[0]

    @property
    def num_envs(self) -> int:
        return self.obs.shape[1]

    def validate(self) -> None:
        t, n = self.obs.shape[:2]
        for name in ("actions", "logprobs", "values", "rewards", "dones", "valid"):
            if getattr(self, name) is None:
                continue
            shape = getattr(self, name).shape
            if shape != (t, n):
                raise ValueError(f"RolloutBatch.{name} has shape {shape}, expected {(t, n)}")
        for name in ("next_value", "next_done"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"RolloutBatch.{name} has shape {getattr(self, name).shape}")
        if self.lstm_state is not None and self.lstm_state[0].shape[1] != n:
            raise ValueError("RolloutBatch.lstm_state does not match the number of envs")
        if (self.meta.num_steps, self.meta.num_envs) != (t, n):
            raise ValueError("RolloutBatch.meta does not match the arrays' [T, N]")

    @staticmethod
    def concat(batches: list["RolloutBatch"]) -> "RolloutBatch":
        """Join runners' batches along the env axis, in the given (runner) order."""
        if len(batches) == 1:
            return batches[0]

        def cat(name, axis):
            return np.concatenate([getattr(b, name) for b in batches], axis=axis)

        lstm = None
        if batches[0].lstm_state is not None:
            lstm = tuple(np.concatenate([b.lstm_state[i] for b in batches], axis=1) for i in (0, 1))
        valid = None
        if any(b.valid is not None for b in batches):
            valid = np.concatenate([np.ones(b.dones.shape, bool) if b.valid is None else b.valid
                                    for b in batches], axis=1)
        metas = [b.meta for b in batches]
        meta = RolloutMeta.concat(metas)
        return RolloutBatch(
            obs=cat("obs", 1), actions=cat("actions", 1), logprobs=cat("logprobs", 1),
            values=cat("values", 1), rewards=cat("rewards", 1), dones=cat("dones", 1),
            next_value=cat("next_value", 0), next_done=cat("next_done", 0), lstm_state=lstm,
            valid=valid, meta=meta)

    def env_slice(self, start: int, stop: int) -> "RolloutBatch":
        """The sub-batch of envs [start, stop): how data-parallel learners split the work.
        Its meta keeps the version and runner; games and timings stay with the whole batch."""
        lstm = None
        if self.lstm_state is not None:
            lstm = tuple(s[:, start:stop] for s in self.lstm_state)
        meta = RolloutMeta(self.num_steps, stop - start,
                           weights_version=self.meta.weights_version,
                           runner_index=self.meta.runner_index)
        return RolloutBatch(
            obs=self.obs[:, start:stop], actions=self.actions[:, start:stop],
            logprobs=self.logprobs[:, start:stop], values=self.values[:, start:stop],
            rewards=self.rewards[:, start:stop], dones=self.dones[:, start:stop],
            next_value=self.next_value[start:stop], next_done=self.next_done[start:stop],
            lstm_state=lstm, valid=None if self.valid is None else self.valid[:, start:stop],
            meta=meta,
        )


class GameLog:
    """The games that ended during one rollout, for its RolloutMeta."""

    def __init__(self) -> None:
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.envs: list[int] = []
        self.envpool_logged: list | None = None   # EnvPool: a list, even when no game logged

    def add(self, step: int, result, env_offset: int = 0) -> None:
        """The games of one step's result; its env indices count from `env_offset` (a group
        of the runner's envs, core/sampler.py)."""
        for ep in result.episodes:
            self.returns.append(float(ep.ret))
            self.lengths.append(int(ep.length))
            self.envs.append(int(ep.env_index) + env_offset)
        if result.envpool_logged is not None:
            self.envpool_logged = self.envpool_logged or []
            self.envpool_logged += [(step, e + env_offset, r) for e, r in result.envpool_logged]

    def fields(self) -> tuple:
        """RolloutMeta's episode_returns, episode_lengths, episode_envs, envpool_logged."""
        logged = None if self.envpool_logged is None else tuple(self.envpool_logged)
        return tuple(self.returns), tuple(self.lengths), tuple(self.envs), logged
