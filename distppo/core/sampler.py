"""Sampler: steps a runner's envs with a copy of the policy and returns one RolloutBatch.

This is the rollout half of CleanRL's loop as a plain object: the local backend calls it
directly, the EnvRunner actor (distributed/runners.py) only forwards to it. There is one loop:

- With one group (--env-groups 1, the default) it is CleanRL's: act for every env, step them,
  T times; actions come from this sampler's own generator in CleanRL's order.
- With k groups each group is its own vector env, stepped on its own thread (EnvPool and
  ale-py step in C++ worker threads and release the GIL), and group g acts for step t once its
  step t-1 is back, so one group's env step runs while the policy acts for the next. Every env
  acts with the same weights, and the batch holds the envs in group order with the seeds one
  vector env of all of them would give them (group g's env i is seeded base + offset_g + i):
  the same experiment. What differs is the random stream: actions are drawn per group, in
  group order (same distribution, other numbers).

`overlap=False` runs the very same schedule without threads (each group's step finishes before
the next policy call): the synchronous reference the tests compare the threaded rollout with.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from distppo.config import TrainConfig
from distppo.core.models import make_agent
from distppo.core.policy import PolicyState, policy_step, policy_value
from distppo.core.rollout import GameLog, RolloutBatch, RolloutMeta
from distppo.core.seeds import env_seed, set_torch_deterministic
from distppo.envs.factory import frame_stack, make_vector_env
from distppo.envs.types import StepResult


class Sampler:
    def __init__(self, groups: list, agent: torch.nn.Module, num_steps: int,
                 runner_index: int = 0, seed: int = 0, exact_resets: bool = False,
                 overlap: bool = True, cuda_graphs: bool = False, exact_replay: bool = False):
        """groups: the runner's vector envs, one per group (one: CleanRL's loop); overlap: a
        thread per group when there are several; exact_replay (--exact-replay): actions from
        torch's global stream, as CleanRL's probs.sample(), which the learner seeds right
        before the initial weights."""
        self.groups = groups
        self.agent = agent
        self.num_steps = num_steps
        self.runner_index = runner_index
        self.seed = seed
        # this sampler's action stream (--exact-replay: torch's global one)
        self.generator = None if exact_replay else torch.Generator().manual_seed(seed)
        self.weights_version = 0
        bounds = np.cumsum([0] + [g.num_envs for g in groups])
        self.slices = [slice(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self.num_envs = int(bounds[-1])
        first = groups[0]
        self.obs_shape, self.obs_dtype = tuple(first.obs_shape), first.obs_dtype
        self.next_obs: list | None = None  # per group [n_g, *obs_shape], reset lazily
        self.next_done = [np.zeros(g.num_envs, dtype=bool) for g in groups]
        self.states = [PolicyState(agent, g.num_envs, cuda_graphs) for g in groups]
        # PPO-LSTM on a next-step auto-reset env (EnvPool): mark its reset steps
        # (docs/semantics.md)
        self.exact_resets = exact_resets and self.states[0].is_lstm
        # one thread per group: a group's step runs there while this thread acts for the next
        self.pool = ThreadPoolExecutor(len(groups)) if overlap and len(groups) > 1 else None

    @property
    def device(self) -> torch.device:
        return self.states[0].device

    def env_spec(self) -> tuple[tuple, int]:
        """(observation shape, number of actions) of the envs."""
        return self.obs_shape, self.groups[0].num_actions

    def set_weights(self, state_dict: dict | None, version: int) -> None:
        """The weights of `version`; None: the agent is the learner's own (--act-in learner),
        which holds them already."""
        if state_dict is not None:
            self.agent.load_state_dict(state_dict)
        self.weights_version = version

    @torch.no_grad()
    def collect(self) -> RolloutBatch:
        start = time.perf_counter()
        if self.next_obs is None:
            self.next_obs = [env.reset() for env in self.groups]
        roll = _Rollout.empty(self.num_steps, self.num_envs, self.obs_shape, self.obs_dtype,
                              self.exact_resets)
        roll.t_env = time.perf_counter() - start
        if self.states[0].is_lstm:  # the state at rollout start, [1, N, H] each
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
        if self.pool is not None:
            return self.pool.submit(self.groups[g].step, roll.actions[step, s])
        begin = time.perf_counter()
        result = self.groups[g].step(roll.actions[step, s])
        roll.t_env += time.perf_counter() - begin
        return result

    def _receive(self, roll: "_Rollout", g: int, step: int, pending) -> None:
        """Group g's env step `step`, once back: rewards, next observations, games."""
        s = self.slices[g]
        if isinstance(pending, Future):
            begin = time.perf_counter()
            pending = pending.result()
            roll.t_env += time.perf_counter() - begin
        roll.rewards[step, s] = pending.reward
        self.next_obs[g], self.next_done[g] = pending.obs, pending.done
        if roll.valid is not None and pending.autoreset is not None:
            # EnvPool reset these envs instead of stepping them: no transition of the game
            # (the loss leaves it out), and the observation it returned starts a new life, so
            # the done arrives with it and the LSTM state is zeroed before it, as in gym's
            # same-step ordering.
            roll.valid[step, s] = ~pending.autoreset
            self.next_done[g] = pending.done | pending.autoreset
        roll.games.add(step, pending, env_offset=s.start)

    def _batch(self, roll: "_Rollout") -> RolloutBatch:
        """The rollout with its bootstrap values (same weights, before the update, as CleanRL
        computes them)."""
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


@dataclass
class RunnerEnvs:
    """One env runner's vector envs, a group each, and the seed of its first env."""
    groups: list
    seed: int

    def spec(self) -> tuple[tuple, int]:
        """(observation shape, number of actions) of the envs."""
        return tuple(self.groups[0].obs_shape), self.groups[0].num_actions


def make_envs(cfg: TrainConfig, runner_index: int, video_dir: str | None = None,
              incarnation: int = 0) -> RunnerEnvs:
    """Runner r's vector envs, their seeds derived from the base seed and, for a runner rebuilt
    after its process died, its incarnation."""
    seed = env_seed(cfg.seed, runner_index, cfg.runner_num_envs, cfg.runner.num_env_runners,
                    incarnation)
    set_torch_deterministic(cfg.torch_deterministic)  # this process's (a Ray env runner's)
    # EnvPool's and ale-py's C++ worker threads: as many as this process's torch threads, the
    # CPUs it owns (placement/resolve.py), so with --overlap stepping stays off the learner's
    # cores.
    k = cfg.runner.env_groups
    per_group = cfg.runner_num_envs // k
    # group g's env i is seeded seed + g * per_group + i: the seeds of one env of them all
    groups = [make_vector_env(cfg.env.env_id, cfg.env.backend, per_group, seed + g * per_group,
                              frame_stack(cfg.ppo.algo),
                              video_dir if runner_index == 0 and g == 0 else None,
                              cfg.env.max_episode_steps,
                              num_threads=max(1, torch.get_num_threads() // k))
              for g in range(k)]
    return RunnerEnvs(groups, seed)


def make_sampler(cfg: TrainConfig, runner_index: int, video_dir: str | None = None,
                 incarnation: int = 0) -> Sampler:
    """Runner r's envs and a policy copy on --runner-device, which set_weights fills."""
    envs = make_envs(cfg, runner_index, video_dir, incarnation)
    agent = make_agent(cfg.ppo.algo, *envs.spec(), cfg.learner.channels_last,
                       cfg.learner.fused_lstm)
    return sampler_on(cfg, envs, runner_index, agent.to(torch.device(cfg.runner.runner_device)))


def sampler_on(cfg: TrainConfig, envs: RunnerEnvs, runner_index: int,
               agent: torch.nn.Module) -> Sampler:
    """The sampler of runner r's envs acting with `agent`: a copy of the weights, or where the
    learner's process acts (--act-in learner) the learner's own agent, its parameters shared."""
    graphs = cfg.learner.cuda_graphs and next(agent.parameters()).device.type == "cuda"
    if graphs:  # the captured steps' draws: the device's stream, this runner's seed
        torch.cuda.manual_seed(envs.seed)
    return Sampler(envs.groups, agent, cfg.ppo.num_steps, runner_index, envs.seed,
                   exact_resets=cfg.ppo.lstm_exact_resets, cuda_graphs=graphs,
                   exact_replay=cfg.ppo.exact_replay)
