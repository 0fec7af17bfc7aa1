"""Pure PPO math, with CleanRL's names so it can be read side by side with ppo_atari.py."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def compute_gae(rewards, values, dones, next_value, next_done, gamma: float, gae_lambda: float):
    """Generalised advantage estimation, backwards over the rollout (CleanRL ppo_atari.py).

    rewards, values, dones: [T, N]; dones[t] is the flag that arrived *with* observation t
    ("observation t starts a new episode"). next_value, next_done: [N] for the observation
    after the last step. Truncation is treated like termination, as CleanRL does.
    Returns (advantages [T, N], returns [T, N]).
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done.to(values.dtype)
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1].to(values.dtype)
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages, returns


def normalize_advantages(mb_advantages, keep=None):
    """CleanRL's per-minibatch normalisation, (A - mean) / (std + 1e-8), torch.std's unbiased
    estimate; keep [MB] bool: the mean and std of those rows only (EnvPool's reset steps are no
    transitions), every row normalised with them."""
    a = mb_advantages if keep is None else mb_advantages[keep]
    return (mb_advantages - a.mean()) / (a.std() + 1e-8)


def ppo_loss(newlogprob, entropy, newvalue, mb_logprobs, mb_advantages, mb_returns, mb_values,
             clip_coef: float, ent_coef: float, vf_coef: float, norm_adv: bool, clip_vloss: bool,
             total: Optional[int] = None):
    """The clipped PPO objective on one minibatch (ppo_atari_envpool.py's lines, its names);
    returns (loss, stats): the stats as detached 0-d tensors, read with float() (one host sync
    each; a captured CUDA graph keeps them on the device, core/captured.py).

    The one reduction, `mean`: with total None the rows are the whole minibatch and it is
    torch.mean, CleanRL's (kept for the one pass: a device's mean kernel need not round as
    sum / n does). With total a number the rows are a slice of a minibatch of `total` rows
    (--grad-shards, core/shards.py) and it is the slice's sum / total, so the slices' losses,
    gradients and stats add up to the minibatch's; the caller then normalises the advantages
    over the whole minibatch (normalize_advantages) and passes norm_adv False."""
    mean = torch.mean if total is None else (lambda x: x.sum() / total)
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()

    with torch.no_grad():
        # http://joschu.net/blog/kl-approx.html
        old_approx_kl = mean(-logratio)
        approx_kl = mean((ratio - 1) - logratio)
        clipfrac = mean(((ratio - 1.0).abs() > clip_coef).float())

    if norm_adv:
        mb_advantages = normalize_advantages(mb_advantages)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = mean(torch.max(pg_loss1, pg_loss2))

    # Value loss
    newvalue = newvalue.view(-1)
    if clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
        v_loss = 0.5 * mean(v_loss_max)
    else:
        v_loss = 0.5 * mean((newvalue - mb_returns) ** 2)

    entropy_loss = mean(entropy)
    loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
    stats = {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "old_approx_kl": old_approx_kl,
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }
    return loss, stats


def as_floats(stats: dict) -> dict:
    """A stats dict of 0-d tensors (ppo_loss's) as Python floats."""
    return {k: float(v) for k, v in stats.items()}


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var(y_true - y_pred) / Var(y_true); NaN when y_true is constant (as CleanRL)."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


def flat_minibatches(batch_size: int, num_minibatches: int, rng: np.random.Generator):
    """One epoch of PPO minibatches: a shuffle of all flat (time, env) indices, cut evenly."""
    b_inds = rng.permutation(batch_size)
    minibatch_size = batch_size // num_minibatches
    return [b_inds[start:start + minibatch_size] for start in range(0, batch_size, minibatch_size)]


def env_minibatches(num_envs: int, num_steps: int, num_minibatches: int, rng: np.random.Generator):
    """One epoch of PPO-LSTM minibatches: whole env sequences (CleanRL ppo_atari_lstm.py).

    Returns [(mbenvinds [E], mb_inds [T*E])]; mb_inds index the flat time-major batch and are
    ordered time-major so the LSTM can replay the sequence from the rollout-start state.
    """
    envinds = rng.permutation(num_envs)
    envsperbatch = num_envs // num_minibatches
    flatinds = np.arange(num_steps * num_envs).reshape(num_steps, num_envs)  # [T, N]
    plans = []
    for start in range(0, num_envs, envsperbatch):
        mbenvinds = envinds[start:start + envsperbatch]
        plans.append((mbenvinds, flatinds[:, mbenvinds].ravel()))  # [T, E] -> [T*E]
    return plans


def annealed_lr(learning_rate: float, iteration: int, num_iterations: int) -> float:
    """Linear schedule: full rate at iteration 1, learning_rate/num_iterations at the last."""
    frac = 1.0 - (iteration - 1.0) / num_iterations
    return frac * learning_rate
