"""The PPO update (CleanRL's optimisation loop) and PPOLearner, the plain object that owns it.

`update()` reads top to bottom like ppo_atari.py / ppo_atari_lstm.py. `sync`, when given,
averages gradients across data-parallel learners between backward() and clipping, exactly
where ppo_atari_multigpu.py does its all-reduce.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from distppo.config import TrainConfig
from distppo.core.models import LSTMAgent, make_agent, take_rows
from distppo.core.ppo import (
    annealed_lr,
    compute_gae,
    env_minibatches,
    explained_variance,
    flat_minibatches,
    ppo_loss,
)
from distppo.core.rollout import RolloutBatch
from distppo.core.seeds import set_torch_deterministic
from distppo.core.shards import ShardPool, sharded_gradients
from distppo.core.threads import shard_plan
from distppo.errors import ConfigError


class GradAllReduce:
    """Data parallelism as ppo_atari_multigpu.py does it: after each backward pass, all
    gradients are flattened into one vector, summed across ranks and divided by the world
    size, then clipped and applied; every rank applies the same step, so weights stay equal.
    Needs an initialised torch.distributed process group (gloo on CPU, nccl on GPU)."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def grads(self, agent: nn.Module) -> None:
        import torch.distributed as dist
        params = [p for p in agent.parameters() if p.grad is not None]
        # reshape, not view: a channels_last conv weight's gradient is not contiguous
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # [sum of numels]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def mean(self, value: float) -> float:
        """A scalar averaged over ranks, so decisions (target_kl early stop) agree everywhere."""
        import torch.distributed as dist
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.item() / self.world_size


def update(agent: nn.Module, optimizer: optim.Optimizer, batch: RolloutBatch, cfg: TrainConfig,
           iteration: int, rng: np.random.Generator, device: torch.device,
           sync: Optional[GradAllReduce] = None, shards: Optional[ShardPool] = None) -> dict:
    """shards: --grad-shards, each minibatch's gradient as the sum of its slices' (core/shards.py;
    None or one slice: CleanRL's single pass)."""
    p = cfg.ppo
    lrnow = p.learning_rate
    if p.anneal_lr:
        lrnow = annealed_lr(p.learning_rate, iteration, cfg.num_iterations)
    optimizer.param_groups[0]["lr"] = lrnow

    def t(a):  # the whole batch moves to the learner's device once per iteration
        x = torch.as_tensor(a)
        if device.type == "cuda":  # pinned pages copy asynchronously, overlapping each other
            return x.pin_memory().to(device, non_blocking=True)
        return x.to(device)

    obs, actions, logprobs = t(batch.obs), t(batch.actions), t(batch.logprobs)
    values, rewards, dones = t(batch.values), t(batch.rewards), t(batch.dones)
    with torch.no_grad():
        advantages, returns = compute_gae(rewards, values, dones, t(batch.next_value),
                                          t(batch.next_done), p.gamma, p.gae_lambda)

    num_steps, num_envs = batch.num_steps, batch.num_envs
    obs_shape = batch.obs.shape[2:]
    # flatten the batch: [T, N, ...] -> [T*N, ...]
    b_obs = obs.reshape((-1,) + obs_shape)
    if getattr(agent, "channels_last", False):
        # once per iteration: every minibatch is then gathered in the CNN's layout (take_rows)
        b_obs = b_obs.contiguous(memory_format=torch.channels_last)
    b_logprobs = logprobs.reshape(-1)
    b_actions = actions.reshape(-1)
    b_dones = dones.reshape(-1).float()
    b_advantages = advantages.reshape(-1)
    b_returns = returns.reshape(-1)
    b_values = values.reshape(-1)
    # [T, N] -> [T*N]; None: every step is a transition of the game (all but PPO-LSTM on EnvPool)
    b_valid = None if batch.valid is None else t(batch.valid).reshape(-1)

    is_lstm = isinstance(agent, LSTMAgent)
    initial_lstm_state = None
    if is_lstm:
        initial_lstm_state = (t(batch.lstm_state[0]), t(batch.lstm_state[1]))  # [1, N, H] each

    sharded = shards is not None and shards.plan.count > 1
    flat = {"logprobs": b_logprobs, "advantages": b_advantages, "returns": b_returns,
            "values": b_values, "valid": b_valid}

    def forward(mb_inds, mbenvinds):  # (newlogprob, entropy, newvalue) of a minibatch or slice
        with autocast(cfg, device):
            newlogprob, entropy, newvalue = _forward(agent, is_lstm, b_obs, b_dones, b_actions,
                                                     mb_inds, mbenvinds, initial_lstm_state,
                                                     device)
        return newlogprob.float(), entropy.float(), newvalue.float()

    stats: dict = {}
    clipfracs = []
    for _epoch in range(p.update_epochs):
        if is_lstm:
            plans = env_minibatches(num_envs, num_steps, p.num_minibatches, rng)
        else:
            plans = [(None, mb) for mb in
                     flat_minibatches(num_envs * num_steps, p.num_minibatches, rng)]
        for mbenvinds, mb_inds in plans:
            mb_inds = torch.as_tensor(mb_inds, device=device)
            if sharded:  # the same gradient, summed over slices of the minibatch (sets .grad)
                stats = sharded_gradients(shards, agent, forward, flat, mb_inds, mbenvinds, p)
            else:
                newlogprob, entropy, newvalue = forward(mb_inds, mbenvinds)
                if b_valid is not None:
                    # EnvPool's reset steps: the LSTM ran over them to keep the sequence whole;
                    # the loss (and the advantage normalisation) leaves them out
                    # (docs/semantics.md).
                    keep = b_valid[mb_inds]
                    newlogprob, entropy, newvalue = newlogprob[keep], entropy[keep], newvalue[keep]
                    mb_inds = mb_inds[keep]
                loss, stats = ppo_loss(
                    newlogprob, entropy, newvalue, b_logprobs[mb_inds], b_advantages[mb_inds],
                    b_returns[mb_inds], b_values[mb_inds], clip_coef=p.clip_coef,
                    ent_coef=p.ent_coef, vf_coef=p.vf_coef, norm_adv=p.norm_adv,
                    clip_vloss=p.clip_vloss)

                optimizer.zero_grad()
                loss.backward()
            clipfracs.append(stats["clipfrac"])
            if sync is not None:
                sync.grads(agent)
            nn.utils.clip_grad_norm_(agent.parameters(), p.max_grad_norm)
            optimizer.step()

        if p.target_kl is not None:
            approx_kl = stats["approx_kl"] if sync is None else sync.mean(stats["approx_kl"])
            if approx_kl > p.target_kl:
                break

    y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
    if b_valid is not None:
        y_pred, y_true = y_pred[batch.valid.reshape(-1)], y_true[batch.valid.reshape(-1)]
    stats["explained_variance"] = explained_variance(y_pred, y_true)
    stats["clipfrac"] = float(np.mean(clipfracs))  # CleanRL logs the mean over all minibatches
    stats["learning_rate"] = lrnow
    return stats


def _forward(agent, is_lstm: bool, b_obs, b_dones, b_actions, mb_inds, mbenvinds,
             initial_lstm_state, device):
    """The minibatch's new log-probs, entropies and values (CleanRL's forward pass)."""
    if is_lstm:
        mbenvinds = torch.as_tensor(mbenvinds, device=device)
        _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
            take_rows(b_obs, mb_inds),
            (initial_lstm_state[0][:, mbenvinds], initial_lstm_state[1][:, mbenvinds]),
            b_dones[mb_inds],
            b_actions[mb_inds],
        )
    else:
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(
            take_rows(b_obs, mb_inds), b_actions[mb_inds])
    return newlogprob, entropy, newvalue


def autocast(cfg: TrainConfig, device: torch.device):
    """--amp bf16: the forward pass in bfloat16 on the GPU (the loss and Adam stay float32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16,
                          enabled=cfg.learner.amp == "bf16" and device.type == "cuda")


def resolve_device(name: str, cuda: bool = True) -> torch.device:
    """CleanRL: cuda if torch.cuda.is_available() and args.cuda else cpu; --device overrides."""
    if name == "auto":
        return torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")
    return torch.device(name)


class PPOLearner:
    """Owns the agent, the optimizer and the minibatch RNG; plain Python, no Ray."""

    def __init__(self, cfg: TrainConfig, obs_shape: tuple, num_actions: int, seed: int,
                 rank: int = 0, threads: Optional[int] = None, own: Optional[int] = None):
        """threads: the most torch threads its updates may use (--grad-shards auto takes one
        slice per thread), own: before --overlap's handover; default: this process's count."""
        self.cfg = cfg
        self.device = resolve_device(cfg.learner.device, cfg.learner.cuda)
        if cfg.learner.amp != "off" and self.device.type != "cuda":
            raise ConfigError(f"--amp {cfg.learner.amp} needs the learner on a GPU and it runs "
                              f"on {self.device}: drop --amp")
        set_torch_deterministic(cfg.torch_deterministic)  # this process's (a Ray learner's)
        torch.manual_seed(seed)  # same seed on every learner: identical initial weights
        self.agent = make_agent(cfg.ppo.algo, obs_shape, num_actions,
                                cfg.learner.channels_last,
                                cfg.learner.fused_lstm).to(self.device)
        if cfg.learner.compile:
            # the bound method, not the module: state_dict keys stay CleanRL's names
            self.agent.get_action_and_value = torch.compile(self.agent.get_action_and_value)
        self.optimizer = optim.Adam(self.agent.parameters(), lr=cfg.ppo.learning_rate, eps=1e-5)
        self.rng = np.random.default_rng(seed + rank)  # rank r shuffles with seed + r, as CleanRL
        self.rank = rank
        self.sync: Optional[GradAllReduce] = None
        threads = torch.get_num_threads() if threads is None else threads
        self.shards = ShardPool(shard_plan(cfg, threads, self.device.type == "cpu", own))

    def update(self, batch: RolloutBatch, iteration: int, wide: int = 0,
               ready: Optional[Callable[[], bool]] = None) -> dict:
        """On this process's torch threads; with `ready` (--overlap), on `wide` from the first
        gradient slice after ready() says the runners' cores are free (the numbers do not
        change: core/shards.py). The thread count is as before afterwards."""
        threads = torch.get_num_threads()
        self.shards.start(threads, wide, ready)
        if self.shards.plan.count > 1:  # every op of a sliced update on a slice's threads, so
            torch.set_num_threads(self.shards.plan.intra)  # its numbers never depend on width
        try:
            return update(self.agent, self.optimizer, batch, self.cfg, iteration, self.rng,
                          self.device, self.sync, self.shards)
        finally:
            torch.set_num_threads(threads)

    def get_weights(self) -> dict:
        """CPU copies of the parameters, for the env runners' policy copies."""
        return {k: v.detach().cpu().clone() for k, v in self.agent.state_dict().items()}

    def state_dict(self) -> dict:
        return {
            "model": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "learner_rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["learner_rng"]  # checkpoints hold rank 0's stream
        if self.rank:  # other ranks derive theirs from it, deterministically and distinct per rank
            self.rng = np.random.default_rng([self.rank, int(self.rng.integers(2**62))])
