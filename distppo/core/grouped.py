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

import numpy as np
import torch

from distppo.core.policy import PolicyState, policy_step, policy_value
from distppo.core.rollout import RolloutBatch, RolloutMeta
from distppo.core.sampler import GameLog
from distppo.envs.types import StepResult


class GroupedSampler:
    def __init__(self, groups: list, agent: torch.nn.Module, num_steps: int,
                 runner_index: int = 0, seed: int = 0, exact_resets: bool = False,
                 overlap: bool = True):
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
        self.states = [PolicyState(agent, g.num_envs) for g in groups]
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
        t_steps, n, groups = self.num_steps, self.num_envs, range(len(self.groups))
        start = time.perf_counter()
        if self.next_obs is None:
            self.next_obs = [env.reset() for env in self.groups]
        t_reset = time.perf_counter() - start
        obs = np.zeros((t_steps, n) + self.obs_shape, dtype=self.obs_dtype)
        actions = np.zeros((t_steps, n), dtype=np.int64)
        logprobs = np.zeros((t_steps, n), dtype=np.float32)
        values = np.zeros((t_steps, n), dtype=np.float32)
        rewards = np.zeros((t_steps, n), dtype=np.float32)
        dones = np.zeros((t_steps, n), dtype=bool)
        valid = np.ones((t_steps, n), dtype=bool) if self.exact_resets else None
        initial_lstm_state = None
        if self.states[0].is_lstm:
            initial_lstm_state = tuple(
                np.concatenate([s.lstm[i].cpu().numpy() for s in self.states], axis=1)
                for i in (0, 1))
        games = GameLog()
        pending: list = [None] * len(self.groups)
        t_infer = t_wait = 0.0

        def act(g: int, step: int) -> None:
            nonlocal t_infer
            s = self.slices[g]
            obs[step, s] = self.next_obs[g]
            dones[step, s] = self.next_done[g]
            begin = time.perf_counter()
            action, logprob, value = policy_step(self.agent, self.next_obs[g], self.next_done[g],
                                                 self.states[g], self.generator)
            t_infer += time.perf_counter() - begin
            actions[step, s] = action.numpy()
            logprobs[step, s] = logprob.numpy()
            values[step, s] = value.flatten().numpy()
            pending[g] = self._send(g, actions[step, s])

        def receive(g: int, step: int) -> None:
            nonlocal t_wait
            s = self.slices[g]
            begin = time.perf_counter()
            result = self._wait(pending[g])
            t_wait += time.perf_counter() - begin
            rewards[step, s] = result.reward
            self.next_obs[g], self.next_done[g] = result.obs, result.done
            if valid is not None and result.autoreset is not None:
                # as Sampler.collect: EnvPool reset these envs instead of stepping them
                valid[step, s] = ~result.autoreset
                self.next_done[g] = result.done | result.autoreset
            games.add(step, result, env_offset=s.start)

        # Group g acts for step t once its step t-1 is back; meanwhile the other groups' steps
        # run on their threads.
        for step in range(t_steps):
            for g in groups:
                if step > 0:
                    receive(g, step - 1)
                act(g, step)
        for g in groups:
            receive(g, t_steps - 1)

        begin = time.perf_counter()
        next_value = np.concatenate([
            policy_value(self.agent, self.next_obs[g], self.next_done[g], self.states[g])
            .flatten().numpy() for g in groups]).astype(np.float32)
        t_infer += time.perf_counter() - begin
        next_done = np.concatenate(self.next_done)
        # t_env_s: what the rollout waited for the envs beyond the policy's time (with overlap,
        # the env time the policy did not hide)
        meta = RolloutMeta(t_steps, n, *games.fields(), t_env_s=t_reset + t_wait,
                           t_infer_s=t_infer, weights_version=self.weights_version,
                           runner_index=self.runner_index)
        return RolloutBatch(
            obs=obs, actions=actions, logprobs=logprobs, values=values, rewards=rewards,
            dones=dones, next_value=next_value, next_done=next_done,
            lstm_state=initial_lstm_state,
            valid=None if valid is None or valid.all() else valid, meta=meta)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        for env in self.groups:
            env.close()
