"""GroupedSampler: a runner's envs in groups, stepped alternately, so that one group's env step
runs while the policy acts for the next group (--env-groups 2).

Each group is its own vector env, stepped on its own thread (EnvPool and ale-py step in C++
worker threads and release the GIL, so the policy's forward pass runs meanwhile). Every env
acts with the same weights, and the batch holds the envs in group order with the seeds one
vector env of all of them would give them (group g's env i is seeded base + offset_g + i): the
same experiment as Sampler. What differs is the random stream: actions are drawn per group, in
group order, so the draws are not CleanRL's (same distribution, other numbers).

`overlap=False` runs the very same schedule without threads (each group's step finishes before
the next policy call): the synchronous reference the tests compare the overlapped rollout with.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from distppo.core.policy import PolicyState, policy_step, policy_value
from distppo.core.rollout import GameLog, RolloutBatch, RolloutMeta
from distppo.envs.types import StepResult


class GroupedSampler:
    def __init__(self, groups: list, agent: torch.nn.Module, num_steps: int,
                 runner_index: int = 0, seed: int = 0, exact_resets: bool = False,
                 overlap: bool = True, cuda_graphs: bool = False):
        self.groups = groups
        self.agent = agent
        self.num_steps = num_steps
        self.runner_index = runner_index
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)  # this sampler's action stream
        self.weights_version = 0
        bounds = np.cumsum([0] + [g.num_envs for g in groups])
        self.slices = [slice(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self.num_envs = int(bounds[-1])
        first = groups[0]
        self.obs_shape, self.obs_dtype = tuple(first.obs_shape), first.obs_dtype
        self.next_obs: list | None = None  # per group [n_g, *obs_shape], reset lazily
        self.next_done = [np.zeros(g.num_envs, dtype=bool) for g in groups]
        self.states = [PolicyState(agent, g.num_envs, cuda_graphs) for g in groups]
        self.exact_resets = exact_resets and self.states[0].is_lstm
        # one thread per group: a group's step runs there while this thread acts for the next
        self.pool = ThreadPoolExecutor(len(groups)) if overlap else None

    @property
    def device(self) -> torch.device:
        return self.states[0].device

    def env_spec(self) -> tuple[tuple, int]:
        """(observation shape, number of actions) of the envs."""
        return self.obs_shape, self.groups[0].num_actions

    def set_weights(self, state_dict: dict, version: int) -> None:
        self.agent.load_state_dict(state_dict)
        self.weights_version = version

    def _send(self, g: int, actions: np.ndarray) -> Future | StepResult:
        if self.pool is None:
            return self.groups[g].step(actions)
        return self.pool.submit(self.groups[g].step, actions)

    @staticmethod
    def _wait(pending: Future | StepResult) -> StepResult:
        return pending.result() if isinstance(pending, Future) else pending

    @torch.no_grad()
    def collect(self) -> RolloutBatch:
        start = time.perf_counter()
        if self.next_obs is None:
            self.next_obs = [env.reset() for env in self.groups]
        roll = _Rollout.empty(self.num_steps, self.num_envs, self.obs_shape, self.obs_dtype,
                              self.exact_resets)
        roll.t_env = time.perf_counter() - start
        if self.states[0].is_lstm:
            roll.lstm_state = tuple(
                np.concatenate([s.lstm[i].cpu().numpy() for s in self.states], axis=1)
                for i in (0, 1))
        pending: list = [None] * len(self.groups)
        # Group g acts for step t once its step t-1 is back; meanwhile the other groups' steps
        # run on their threads.
        for step in range(self.num_steps):
            for g in range(len(self.groups)):
                if step > 0:
                    self._receive(roll, g, step - 1, pending[g])
                pending[g] = self._act(roll, g, step)
        for g in range(len(self.groups)):
            self._receive(roll, g, self.num_steps - 1, pending[g])
        return self._batch(roll)

    def _act(self, roll: "_Rollout", g: int, step: int) -> Future | StepResult:
        """Group g's actions for `step`, sent to its envs; returns the pending step."""
        s = self.slices[g]
        roll.obs[step, s] = self.next_obs[g]
        roll.dones[step, s] = self.next_done[g]
        begin = time.perf_counter()
        action, logprob, value = policy_step(self.agent, self.next_obs[g], self.next_done[g],
                                             self.states[g], self.generator)
        roll.t_infer += time.perf_counter() - begin
        roll.actions[step, s] = action.numpy()
        roll.logprobs[step, s] = logprob.numpy()
        roll.values[step, s] = value.flatten().numpy()
        return self._send(g, roll.actions[step, s])

    def _receive(self, roll: "_Rollout", g: int, step: int, pending) -> None:
        """Group g's env step `step`, once back: rewards, next observations, games."""
        s = self.slices[g]
        begin = time.perf_counter()
        result = self._wait(pending)
        roll.t_env += time.perf_counter() - begin
        roll.rewards[step, s] = result.reward
        self.next_obs[g], self.next_done[g] = result.obs, result.done
        if roll.valid is not None and result.autoreset is not None:
            # as Sampler.collect: EnvPool reset these envs instead of stepping them
            roll.valid[step, s] = ~result.autoreset
            self.next_done[g] = result.done | result.autoreset
        roll.games.add(step, result, env_offset=s.start)

    def _batch(self, roll: "_Rollout") -> RolloutBatch:
        """The rollout with its bootstrap values (same weights, before the update)."""
        begin = time.perf_counter()
        next_value = np.concatenate([
            policy_value(self.agent, self.next_obs[g], self.next_done[g], self.states[g])
            .flatten().numpy() for g in range(len(self.groups))]).astype(np.float32)
        roll.t_infer += time.perf_counter() - begin
        # t_env_s: the reset and what the rollout waited for the envs (with threads, the env
        # time the policy's forward passes did not hide)
        meta = RolloutMeta(self.num_steps, self.num_envs, *roll.games.fields(),
                           t_env_s=roll.t_env, t_infer_s=roll.t_infer,
                           weights_version=self.weights_version, runner_index=self.runner_index)
        valid = roll.valid
        return RolloutBatch(
            obs=roll.obs, actions=roll.actions, logprobs=roll.logprobs, values=roll.values,
            rewards=roll.rewards, dones=roll.dones, next_value=next_value,
            next_done=np.concatenate(self.next_done), lstm_state=roll.lstm_state,
            valid=None if valid is None or valid.all() else valid, meta=meta)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        for env in self.groups:
            env.close()


@dataclass
class _Rollout:
    """One rollout's arrays as they fill ([T, N, ...], envs in group order) and its timings."""
    obs: np.ndarray
    actions: np.ndarray
    logprobs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    valid: np.ndarray | None
    games: GameLog = field(default_factory=GameLog)
    lstm_state: tuple | None = None
    t_env: float = 0.0
    t_infer: float = 0.0

    @staticmethod
    def empty(t: int, n: int, obs_shape: tuple, obs_dtype, with_valid: bool) -> "_Rollout":
        return _Rollout(
            obs=np.zeros((t, n) + obs_shape, dtype=obs_dtype),
            actions=np.zeros((t, n), dtype=np.int64),
            logprobs=np.zeros((t, n), dtype=np.float32),
            values=np.zeros((t, n), dtype=np.float32),
            rewards=np.zeros((t, n), dtype=np.float32),
            dones=np.zeros((t, n), dtype=bool),
            valid=np.ones((t, n), dtype=bool) if with_valid else None)
