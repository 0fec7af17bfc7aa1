"""Sampler: steps a vector env with a CPU copy of the policy and returns one RolloutBatch.

This is the rollout half of CleanRL's loop, unchanged, as a plain object: the local backend
calls it directly, the EnvRunner actor (distributed/runners.py) only forwards to it.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from distppo.config import TrainConfig
from distppo.core.grouped import GroupedSampler
from distppo.core.models import make_agent
from distppo.core.policy import PolicyState, policy_step, policy_value
from distppo.core.rollout import GameLog, RolloutBatch, RolloutMeta
from distppo.core.seeds import env_seed, set_torch_deterministic
from distppo.envs.factory import frame_stack, make_vector_env


class Sampler:
    def __init__(self, vec_env, agent: torch.nn.Module, num_steps: int, runner_index: int = 0,
                 seed: int = 0, exact_resets: bool = False, cuda_graphs: bool = False,
                 exact_replay: bool = False):
        self.env = vec_env
        # this sampler's action stream; --exact-replay: torch's global one, as CleanRL's
        # probs.sample(), which the learner seeds right before the initial weights
        self.generator = None if exact_replay else torch.Generator().manual_seed(seed)
        self.agent = agent
        self.num_steps = num_steps
        self.runner_index = runner_index
        self.seed = seed
        self.weights_version = 0
        self.next_obs = None  # [N, *obs_shape], reset lazily so the SPS timer covers it
        self.next_done = np.zeros(vec_env.num_envs, dtype=bool)
        self.state = PolicyState(agent, vec_env.num_envs, cuda_graphs)
        # PPO-LSTM on a next-step auto-reset env (EnvPool): mark its reset steps (docs/semantics.md)
        self.exact_resets = exact_resets and self.state.is_lstm

    @property
    def device(self) -> torch.device:
        return self.state.device

    def env_spec(self) -> tuple[tuple, int]:
        """(observation shape, number of actions) of the envs."""
        return tuple(self.env.obs_shape), self.env.num_actions

    def set_weights(self, state_dict: dict, version: int) -> None:
        self.agent.load_state_dict(state_dict)
        self.weights_version = version

    @torch.no_grad()
    def collect(self) -> RolloutBatch:
        env, t_steps, n = self.env, self.num_steps, self.env.num_envs
        t_env = t_infer = 0.0
        if self.next_obs is None:
            start = time.perf_counter()
            self.next_obs = env.reset()
            t_env += time.perf_counter() - start
        obs = np.zeros((t_steps, n) + tuple(env.obs_shape), dtype=env.obs_dtype)
        actions = np.zeros((t_steps, n), dtype=np.int64)
        logprobs = np.zeros((t_steps, n), dtype=np.float32)
        values = np.zeros((t_steps, n), dtype=np.float32)
        rewards = np.zeros((t_steps, n), dtype=np.float32)
        dones = np.zeros((t_steps, n), dtype=bool)
        valid = np.ones((t_steps, n), dtype=bool) if self.exact_resets else None
        initial_lstm_state = None
        if self.state.is_lstm:
            initial_lstm_state = tuple(s.cpu().numpy().copy() for s in self.state.lstm)
        games = GameLog()

        for step in range(t_steps):
            obs[step] = self.next_obs
            dones[step] = self.next_done
            start = time.perf_counter()
            action, logprob, value = policy_step(self.agent, self.next_obs, self.next_done,
                                                 self.state, self.generator)
            actions[step] = action.numpy()
            logprobs[step] = logprob.numpy()
            values[step] = value.flatten().numpy()
            mid = time.perf_counter()
            result = env.step(actions[step])
            t_env += time.perf_counter() - mid
            t_infer += mid - start
            rewards[step] = result.reward
            self.next_obs, self.next_done = result.obs, result.done
            if valid is not None and result.autoreset is not None:
                # EnvPool reset these envs instead of stepping them: no transition of the
                # game (the loss leaves it out), and the observation it returned starts a new
                # life, so the done arrives with it and the LSTM state is zeroed before it,
                # as in gym's same-step ordering.
                valid[step] = ~result.autoreset
                self.next_done = result.done | result.autoreset
            games.add(step, result)

        # Bootstrap value with the same weights (CleanRL computes it before the update).
        start = time.perf_counter()
        next_value = policy_value(self.agent, self.next_obs, self.next_done, self.state)
        t_infer += time.perf_counter() - start

        meta = RolloutMeta(t_steps, n, *games.fields(), t_env_s=t_env, t_infer_s=t_infer,
                           weights_version=self.weights_version, runner_index=self.runner_index)
        return RolloutBatch(
            obs=obs, actions=actions, logprobs=logprobs, values=values, rewards=rewards,
            dones=dones, next_value=next_value.flatten().numpy().astype(np.float32),
            next_done=self.next_done.copy(), lstm_state=initial_lstm_state,
            valid=None if valid is None or valid.all() else valid, meta=meta)

    def close(self) -> None:
        self.env.close()


def make_sampler(cfg: TrainConfig, runner_index: int, video_dir: str | None = None,
                 incarnation: int = 0) -> Sampler:
    """Runner r's vector env (its seeds derived from the base seed and, for a runner rebuilt
    after its process died, its incarnation) and a policy copy on --runner-device."""
    seed = env_seed(cfg.seed, runner_index, cfg.runner_num_envs, cfg.runner.num_env_runners,
                    incarnation)
    set_torch_deterministic(cfg.torch_deterministic)  # this process's (a Ray env runner's)
    # EnvPool's and ale-py's C++ worker threads: as many as this process's torch threads, the
    # CPUs it owns (placement/resolve.py), so with --overlap stepping stays off the learner's cores.
    k = cfg.runner.env_groups
    per_group = cfg.runner_num_envs // k
    # group g's env i is seeded seed + g * per_group + i: the seeds of one env of them all
    groups = [make_vector_env(cfg.env.env_id, cfg.env.backend, per_group, seed + g * per_group,
                              frame_stack(cfg.ppo.algo),
                              video_dir if runner_index == 0 and g == 0 else None,
                              cfg.env.max_episode_steps,
                              num_threads=max(1, torch.get_num_threads() // k))
              for g in range(k)]
    agent = make_agent(cfg.ppo.algo, tuple(groups[0].obs_shape), groups[0].num_actions,
                       cfg.learner.channels_last, cfg.learner.fused_lstm)
    agent.to(torch.device(cfg.runner.runner_device))
    graphs = cfg.learner.cuda_graphs and cfg.runner.runner_device == "cuda"
    if graphs:  # the captured steps' draws: the device's stream, this runner's seed
        torch.cuda.manual_seed(seed)
    if k > 1:
        return GroupedSampler(groups, agent, cfg.ppo.num_steps, runner_index, seed,
                              exact_resets=cfg.ppo.lstm_exact_resets, cuda_graphs=graphs)
    return Sampler(groups[0], agent, cfg.ppo.num_steps, runner_index, seed,
                   exact_resets=cfg.ppo.lstm_exact_resets, cuda_graphs=graphs,
                   exact_replay=cfg.ppo.exact_replay)
