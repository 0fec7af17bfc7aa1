"""The PPO update: CleanRL's optimisation loop (PPOLearner, core/learner.py, owns its state).

`update()` reads top to bottom like ppo_atari_envpool.py / ppo_atari_lstm.py, in three parts:
`prepare` (GAE, then the rollout flattened into a `FlatBatch` with CleanRL's b_ names),
`minibatch_plan` (one epoch's shuffled minibatches) and `minibatch_step` (gradient, all-reduce,
clipping, Adam). It is the one update loop: --cuda-graphs (core/captured.py) hands it a step
that replays minibatch_step as a captured graph instead of calling it (`EagerStep` here).
Every gradient is the gradient of `minibatch_loss`: in one pass, CleanRL's loss.backward(),
or with --grad-shards summed over slices of the minibatch (core/shards.py), the slices computed
by that same function. `sync`, when given, averages gradients across
data-parallel learners between backward() and clipping, exactly where ppo_atari_multigpu.py
does its all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from distppo.config import PPOConfig, TrainConfig
from distppo.core.models import LSTMAgent, take_rows
from distppo.core.ppo import (
    annealed_lr,
    as_floats,
    compute_gae,
    env_minibatches,
    explained_variance,
    flat_minibatches,
    normalize_advantages,
    ppo_loss,
)
from distppo.core.rollout import RolloutBatch
from distppo.core.shards import ShardPool


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


@dataclass
class FlatBatch:
    """One rollout on the learner's device, flattened as CleanRL flattens it:
    [T, N, ...] -> [T*N, ...], time-major (row t * N + n is env n's step t)."""
    b_obs: torch.Tensor         # [T*N, *obs_shape], uint8 frames (channels_last if the CNN is)
    b_logprobs: torch.Tensor    # [T*N] float32, log-probs of the actions at sampling
    b_actions: torch.Tensor     # [T*N] int64
    b_dones: torch.Tensor       # [T*N] float32, 1.0 where the step starts an episode
    b_advantages: torch.Tensor  # [T*N] float32, GAE
    b_returns: torch.Tensor     # [T*N] float32, b_advantages + b_values
    b_values: torch.Tensor      # [T*N] float32, values at sampling
    # [T*N] bool: False at EnvPool's reset steps (PPO-LSTM's exact resets), which the LSTM
    # runs over and the loss leaves out (docs/semantics.md); None: every step counts
    b_valid: Optional[torch.Tensor]
    # PPO-LSTM: (h, c), each [1, N, H], the state at rollout start; None: the flat agent
    initial_lstm_state: Optional[tuple]
    num_steps: int              # T
    num_envs: int               # N


class EagerStep:
    """CleanRL's minibatch step: minibatch_step on the iteration's own FlatBatch."""

    def __init__(self, agent: nn.Module, optimizer: optim.Optimizer, cfg: TrainConfig,
                 sync: Optional[GradAllReduce] = None, shards: Optional[ShardPool] = None):
        self.agent, self.optimizer, self.cfg = agent, optimizer, cfg
        self.sync, self.shards = sync, shards

    def start(self, b: FlatBatch) -> FlatBatch:
        """The batch the iteration's minibatches are taken from."""
        return b

    def __call__(self, b: FlatBatch, mb_inds: np.ndarray, mbenvinds: Optional[np.ndarray]
                 ) -> dict:
        """One optimizer step on rows mb_inds [MB]; the minibatch's stats."""
        rows = torch.as_tensor(mb_inds, device=b.b_obs.device)
        return minibatch_step(self.agent, self.optimizer, b, rows, mbenvinds, self.cfg,
                              self.sync, self.shards)


def update(agent: nn.Module, optimizer: optim.Optimizer, batch: RolloutBatch, cfg: TrainConfig,
           iteration: int, rng: np.random.Generator, device: torch.device,
           sync: Optional[GradAllReduce] = None, shards: Optional[ShardPool] = None,
           step: Optional[EagerStep] = None) -> dict:
    """CleanRL's update on one rollout; returns what CleanRL logs: the last minibatch's
    losses and KLs, clipfrac over every minibatch, explained variance, the learning rate.
    shards: --grad-shards (core/shards.py; None or one slice: CleanRL's single pass); step:
    how a minibatch step runs (None: EagerStep; --cuda-graphs: core/captured.CapturedStep)."""
    p = cfg.ppo
    lrnow = learning_rate(cfg, iteration)
    set_lr(optimizer, lrnow)
    step = step or EagerStep(agent, optimizer, cfg, sync, shards)
    b = step.start(prepare(agent, batch, p, device))

    stats: dict = {}
    clipfracs = []  # per minibatch, read on the host once, at the end
    for _epoch in range(p.update_epochs):
        for mbenvinds, mb_inds in minibatch_plan(b, p.num_minibatches, rng):
            stats = step(b, mb_inds, mbenvinds)
            clipfracs.append(stats["clipfrac"])
        if p.target_kl is not None:
            approx_kl = float(stats["approx_kl"])
            if sync is not None:
                approx_kl = sync.mean(approx_kl)
            if approx_kl > p.target_kl:
                break
    return iteration_stats(b, as_floats(stats), host_floats(clipfracs), lrnow)


def host_floats(values: list) -> list[float]:
    """0-d tensors (or floats: gradient slices give floats) as Python floats, one copy for
    them all."""
    if values and all(torch.is_tensor(v) for v in values):
        return torch.stack(values).cpu().tolist()
    return [float(v) for v in values]


def set_lr(optimizer: optim.Optimizer, lr: float) -> None:
    """The learning rate of the (one) param group: in place where it is a tensor, which a
    captured Adam step reads at every replay."""
    group = optimizer.param_groups[0]
    if torch.is_tensor(group["lr"]):
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr


def learning_rate(cfg: TrainConfig, iteration: int) -> float:
    """The iteration's learning rate: CleanRL's linear annealing, or the constant rate."""
    p = cfg.ppo
    return annealed_lr(p.learning_rate, iteration, cfg.num_iterations) if p.anneal_lr \
        else p.learning_rate


def iteration_stats(b: "FlatBatch", last: dict, clipfracs: list, lrnow: float) -> dict:
    """What CleanRL logs of an update: the last minibatch's stats (floats), clipfrac over every
    minibatch, the explained variance of the rollout's values, the learning rate."""
    y_pred, y_true = b.b_values.cpu().numpy(), b.b_returns.cpu().numpy()
    if b.b_valid is not None:
        valid = b.b_valid.cpu().numpy()
        y_pred, y_true = y_pred[valid], y_true[valid]
    stats = dict(last)
    stats["explained_variance"] = explained_variance(y_pred, y_true)
    stats["clipfrac"] = float(np.mean(clipfracs))  # CleanRL logs the mean over all minibatches
    stats["learning_rate"] = lrnow
    return stats


def prepare(agent: nn.Module, batch: RolloutBatch, p: PPOConfig,
            device: torch.device) -> FlatBatch:
    """The rollout on `device`, its advantages and returns (GAE), flattened."""
    def on_device(a):  # the whole batch moves to the learner's device once per iteration
        x = torch.as_tensor(a)
        if device.type == "cuda":  # pinned pages copy asynchronously, overlapping each other
            return x.pin_memory().to(device, non_blocking=True)
        return x.to(device)

    obs, actions, logprobs = (on_device(batch.obs), on_device(batch.actions),
                              on_device(batch.logprobs))
    values, rewards, dones = (on_device(batch.values), on_device(batch.rewards),
                              on_device(batch.dones))
    with torch.no_grad():
        advantages, returns = compute_gae(rewards, values, dones, on_device(batch.next_value),
                                          on_device(batch.next_done), p.gamma, p.gae_lambda)

    # flatten the batch: [T, N, ...] -> [T*N, ...]
    b_obs = obs.reshape((-1,) + batch.obs.shape[2:])
    if getattr(agent, "channels_last", False):
        # once per iteration: every minibatch is then gathered in the CNN's layout (take_rows)
        b_obs = b_obs.contiguous(memory_format=torch.channels_last)
    initial_lstm_state = None
    if isinstance(agent, LSTMAgent):
        # [1, N, H] each
        initial_lstm_state = (on_device(batch.lstm_state[0]), on_device(batch.lstm_state[1]))
    return FlatBatch(
        b_obs=b_obs,
        b_logprobs=logprobs.reshape(-1),
        b_actions=actions.reshape(-1),
        b_dones=dones.reshape(-1).float(),
        b_advantages=advantages.reshape(-1),
        b_returns=returns.reshape(-1),
        b_values=values.reshape(-1),
        # [T, N] -> [T*N]
        b_valid=None if batch.valid is None else on_device(batch.valid).reshape(-1),
        initial_lstm_state=initial_lstm_state,
        num_steps=batch.num_steps, num_envs=batch.num_envs)


def minibatch_plan(b: FlatBatch, num_minibatches: int, rng: np.random.Generator) -> list:
    """One epoch's minibatches, [(mbenvinds, mb_inds)]: shuffled rows for PPO (mbenvinds None),
    whole env sequences, time-major, for PPO-LSTM (core/ppo.py)."""
    if b.initial_lstm_state is not None:
        return env_minibatches(b.num_envs, b.num_steps, num_minibatches, rng)
    return [(None, mb_inds) for mb_inds in
            flat_minibatches(b.num_envs * b.num_steps, num_minibatches, rng)]


def minibatch_step(agent: nn.Module, optimizer: optim.Optimizer, b: FlatBatch,
                   mb_inds: torch.Tensor, mbenvinds: Optional[np.ndarray], cfg: TrainConfig,
                   sync: Optional[GradAllReduce], shards: Optional[ShardPool]) -> dict:
    """One optimizer step on the minibatch rows mb_inds [MB]: the gradient of minibatch_loss,
    the all-reduce, clipping, Adam; returns the minibatch's stats (ppo_loss's: 0-d tensors,
    floats with gradient slices). Without sync and slices, on a GPU, no op here waits for the
    host: core/captured.py captures it as a CUDA graph."""
    p = cfg.ppo
    mb_advantages = b.b_advantages[mb_inds]  # [MB]
    keep = None if b.b_valid is None else b.b_valid[mb_inds]  # [MB] bool
    if p.norm_adv:  # over the whole minibatch (its valid steps), before any slicing
        mb_advantages = normalize_advantages(mb_advantages, keep)

    if shards is None or shards.plan.count == 1:
        loss, stats = minibatch_loss(agent, b, mb_inds, mbenvinds, mb_advantages, cfg)
        optimizer.zero_grad()
        loss.backward()
    else:
        # every slice's means over the minibatch's (valid) size: their sum is its loss
        # (a minibatch with no valid step at all: 0 here where one pass gives NaN)
        total = max(1, len(mb_inds) if keep is None else int(keep.sum()))
        stats = shards.gradients(
            list(agent.parameters()), len(mb_inds), mbenvinds,
            lambda pos, envs: minibatch_loss(agent, b, mb_inds[pos], envs, mb_advantages[pos],
                                             cfg, total))
    if sync is not None:
        sync.grads(agent)
    nn.utils.clip_grad_norm_(agent.parameters(), p.max_grad_norm)
    optimizer.step()
    return stats


def minibatch_loss(agent: nn.Module, b: FlatBatch, mb_inds: torch.Tensor,
                   mbenvinds: Optional[np.ndarray], mb_advantages: torch.Tensor,
                   cfg: TrainConfig, total: Optional[int] = None) -> tuple:
    """CleanRL's minibatch loss on rows mb_inds [MB] of b (PPO-LSTM: the envs mbenvinds [E],
    time-major); returns (loss, stats). mb_advantages [MB]: those rows' advantages, already
    normalised over the whole minibatch. total: None, the rows are the whole minibatch and
    every mean is torch.mean (CleanRL's); a number, the rows are a slice of a minibatch of
    `total` steps and every mean is the slice's sum / total (ppo_loss)."""
    p = cfg.ppo
    newlogprob, entropy, newvalue = _forward(agent, b, mb_inds, mbenvinds, cfg)
    if b.b_valid is not None:
        # EnvPool's reset steps: the LSTM ran over them to keep the sequence whole; the loss
        # leaves them out (docs/semantics.md)
        keep = b.b_valid[mb_inds]
        newlogprob, entropy, newvalue = newlogprob[keep], entropy[keep], newvalue[keep]
        mb_inds, mb_advantages = mb_inds[keep], mb_advantages[keep]
    return ppo_loss(newlogprob, entropy, newvalue, b.b_logprobs[mb_inds], mb_advantages,
                    b.b_returns[mb_inds], b.b_values[mb_inds], clip_coef=p.clip_coef,
                    ent_coef=p.ent_coef, vf_coef=p.vf_coef, norm_adv=False,
                    clip_vloss=p.clip_vloss, total=total)


def _forward(agent: nn.Module, b: FlatBatch, mb_inds: torch.Tensor,
             mbenvinds: Optional[np.ndarray], cfg: TrainConfig) -> tuple:
    """The rows' (newlogprob, entropy, newvalue), float32 (CleanRL's forward pass)."""
    device = b.b_obs.device
    with autocast(cfg, device):
        if b.initial_lstm_state is None:
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                take_rows(b.b_obs, mb_inds), b.b_actions[mb_inds])
        else:
            h, c = b.initial_lstm_state
            mbenvinds = torch.as_tensor(mbenvinds, device=device)
            _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                take_rows(b.b_obs, mb_inds),
                (h[:, mbenvinds], c[:, mbenvinds]),
                b.b_dones[mb_inds],
                b.b_actions[mb_inds],
            )
    return newlogprob.float(), entropy.float(), newvalue.float()


def autocast(cfg: TrainConfig, device: torch.device):
    """--amp bf16: the forward pass in bfloat16 on the GPU (the loss and Adam stay float32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16,
                          enabled=cfg.learner.amp == "bf16" and device.type == "cuda")


def resolve_device(name: str, cuda: bool = True) -> torch.device:
    """CleanRL: cuda if torch.cuda.is_available() and args.cuda else cpu; --device overrides."""
    if name == "auto":
        return torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")
    return torch.device(name)
