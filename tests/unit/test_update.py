"""The update's one loss step: the flat batch is CleanRL's time-major flattening, and the
slices of `minibatch_loss` (--grad-shards) add up to the one-pass loss and gradient, EnvPool's
reset steps left out of both (no envs, no Ray)."""
import numpy as np
import pytest
import torch

from distppo.config import TrainConfig
from distppo.core.learner import PPOLearner
from distppo.core.ppo import compute_gae, normalize_advantages
from distppo.core.shards import slices
from distppo.core.update import minibatch_loss, minibatch_plan, prepare

from helpers import ROLLOUT_ENVS as N
from helpers import ROLLOUT_STEPS as T
from helpers import rollout_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _learner(algo: str) -> tuple:
    cfg = TrainConfig().replace(algo=algo, num_envs=N, num_steps=T, num_minibatches=2,
                                grad_shards=1)
    frames = 1 if algo == "ppo_lstm" else 4
    return cfg, PPOLearner(cfg, (frames, 84, 84), 4, seed=1)


def test_flat_batch_is_time_major_with_gae_and_the_valid_mask():
    batch = rollout_batch("ppo_lstm", valid=True)
    cfg, learner = _learner("ppo_lstm")
    b = prepare(learner.agent, batch, cfg.ppo, learner.device)
    advantages, returns = compute_gae(*(torch.as_tensor(a) for a in (
        batch.rewards, batch.values, batch.dones, batch.next_value, batch.next_done)),
        cfg.ppo.gamma, cfg.ppo.gae_lambda)
    t, n = 5, 3
    row = t * N + n  # [T, N] -> [T*N]: row t * N + n is env n's step t
    assert torch.equal(b.b_obs[row], torch.as_tensor(batch.obs[t, n]))
    assert b.b_actions[row] == batch.actions[t, n] and b.b_values[row] == batch.values[t, n]
    assert b.b_dones[row] == float(batch.dones[t, n]) and b.b_dones.dtype == torch.float32
    assert torch.equal(b.b_advantages, advantages.reshape(-1))
    assert torch.equal(b.b_returns, returns.reshape(-1))
    assert torch.equal(b.b_valid, torch.as_tensor(batch.valid).reshape(-1))
    assert b.initial_lstm_state[0].shape == (1, N, 128)
    assert (b.num_steps, b.num_envs) == (T, N)


def test_normalize_advantages_takes_mean_and_std_over_the_kept_rows():
    a = torch.tensor([1.0, 2.0, 100.0, 4.0])
    keep = torch.tensor([True, True, False, True])
    kept = a[keep]
    torch.testing.assert_close(normalize_advantages(a, keep)[keep],
                               (kept - kept.mean()) / (kept.std() + 1e-8))
    assert torch.equal(normalize_advantages(a), (a - a.mean()) / (a.std() + 1e-8))


@pytest.mark.parametrize("algo,valid,count", [("ppo", False, 3), ("ppo_lstm", False, 2),
                                              ("ppo_lstm", True, 2)])
def test_slices_of_minibatch_loss_add_up_to_the_one_pass_loss(algo, valid, count):
    batch = rollout_batch(algo, valid)
    cfg, learner = _learner(algo)
    agent, params = learner.agent, list(learner.agent.parameters())
    b = prepare(agent, batch, cfg.ppo, learner.device)
    plans = minibatch_plan(b, 2, np.random.default_rng(0))
    if valid:  # the minibatch with the most reset steps
        plans.sort(key=lambda plan: int(b.b_valid[plan[1]].sum()))
    mbenvinds, mb_inds = plans[0]
    mb_inds = torch.as_tensor(mb_inds)
    keep = None if b.b_valid is None else b.b_valid[mb_inds]
    mb_advantages = normalize_advantages(b.b_advantages[mb_inds], keep)
    total = len(mb_inds) if keep is None else int(keep.sum())
    if valid:
        assert total < len(mb_inds)  # the mask leaves some steps out

    loss, stats = minibatch_loss(agent, b, mb_inds, mbenvinds, mb_advantages, cfg)
    grads = torch.autograd.grad(loss, params)
    pieces = [minibatch_loss(agent, b, mb_inds[pos], envs, mb_advantages[pos], cfg, total)
              for pos, envs in slices(count, len(mb_inds), mbenvinds)]
    assert len(pieces) == count
    torch.testing.assert_close(sum(p[0] for p in pieces), loss, rtol=1e-5, atol=1e-7)
    for k in stats:
        assert sum(float(p[1][k]) for p in pieces) == pytest.approx(float(stats[k]), rel=1e-5,
                                                                    abs=1e-7), k
    sliced = [torch.autograd.grad(p[0], params) for p in pieces]
    for i, g in enumerate(grads):
        torch.testing.assert_close(sum(s[i] for s in sliced), g, rtol=1e-4, atol=1e-6)
