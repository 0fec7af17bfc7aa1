"""PPO math against slow references and hand-computed values (no envs, no Ray)."""
import numpy as np
import pytest
import torch

from distppo.config import TrainConfig
from distppo.core.models import Agent, LSTMAgent, gumbel_sample
from distppo.core.ppo import (
    annealed_lr,
    as_floats,
    compute_gae,
    env_minibatches,
    explained_variance,
    flat_minibatches,
    ppo_loss,
)


def slow_gae(rewards, values, dones, next_value, next_done, gamma, lam):
    """Per env, per step, straight from the GAE definition with done masking (Schulman 2016,
    eq. 16)."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                if k + 1 < T:
                    v_next, nonterminal = values[k + 1, n], 1.0 - dones[k + 1, n]
                else:
                    v_next, nonterminal = next_value[n], 1.0 - next_done[n]
                delta = rewards[k, n] + gamma * v_next * nonterminal - values[k, n]
                total += discount * delta
                if not nonterminal:
                    break
                discount *= gamma * lam
            adv[t, n] = total
    return adv, adv + values


def test_gae_matches_slow_reference():
    rng = np.random.default_rng(0)
    T, N = 17, 5
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    dones = rng.random((T, N)) < 0.15
    next_value, next_done = rng.normal(size=N), rng.random(N) < 0.3
    adv, ret = compute_gae(*(torch.tensor(a)
                             for a in (rewards, values, dones, next_value, next_done)),
                           gamma=0.99, gae_lambda=0.95)
    ref_adv, ref_ret = slow_gae(rewards, values, dones, next_value, next_done, 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-10, atol=1e-10)


def test_gae_constant_value_analytic():
    # reward 1 each step, value v everywhere, no dones, bootstrap v:
    # delta = 1 + (gamma - 1) v for every t, advantage_t = delta * sum_{k<T-t} (gamma*lam)^k
    T, gamma, lam, v = 10, 0.9, 0.8, 2.0
    rewards = torch.ones(T, 1, dtype=torch.float64)
    values = torch.full((T, 1), v, dtype=torch.float64)
    dones = torch.zeros(T, 1, dtype=torch.bool)
    adv, ret = compute_gae(rewards, values, dones, torch.tensor([v], dtype=torch.float64),
                           torch.tensor([False]), gamma, lam)
    delta = 1 + (gamma - 1) * v
    expected = [delta * (1 - (gamma * lam) ** (T - t)) / (1 - gamma * lam) for t in range(T)]
    np.testing.assert_allclose(adv[:, 0].numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(ret[:, 0].numpy(), np.array(expected) + v, rtol=1e-12)


def test_gae_done_cuts_bootstrap():
    # a done arriving with obs 1 means step 0's advantage ignores everything after it
    rewards = torch.tensor([[1.0], [5.0]])
    values = torch.tensor([[0.5], [3.0]])
    dones = torch.tensor([[False], [True]])
    adv, _ = compute_gae(rewards, values, dones, torch.tensor([7.0]), torch.tensor([False]),
                         0.99, 0.95)
    assert adv[0, 0].item() == pytest.approx(1.0 - 0.5)
    assert adv[1, 0].item() == pytest.approx(5.0 + 0.99 * 7.0 - 3.0)


def test_ppo_loss_hand_computed():
    newlogprob = torch.log(torch.tensor([0.5, 0.2]))
    oldlogprob = torch.log(torch.tensor([0.4, 0.25]))
    adv = torch.tensor([1.0, -2.0])
    newvalue = torch.tensor([[1.5], [0.0]])
    returns = torch.tensor([1.0, 1.0])
    oldvalues = torch.tensor([1.2, 0.5])
    entropy = torch.tensor([1.0, 0.5])
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, oldlogprob, adv, returns, oldvalues,
                           clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, norm_adv=False,
                           clip_vloss=True)
    stats = as_floats(stats)
    r = np.array([0.5 / 0.4, 0.2 / 0.25])  # 1.25, 0.8
    # sample 0: A=1, max(-1.25, -1.1) = -1.1; sample 1: A=-2, max(1.6, 1.8) = 1.8
    pg = (-1.1 + 1.8) / 2
    # value: s0 unclipped (1.5-1)^2=0.25, clipped v=1.2+0.1=1.3 -> 0.09 -> max 0.25
    #        s1 unclipped 1.0, clipped v=0.5-0.1=0.4 -> 0.36 -> max 1.0
    v = 0.5 * (0.25 + 1.0) / 2
    ent = 0.75
    assert stats["policy_loss"] == pytest.approx(pg, rel=1e-6)
    assert stats["value_loss"] == pytest.approx(v, rel=1e-6)
    assert stats["entropy"] == pytest.approx(ent)
    assert loss.item() == pytest.approx(pg - 0.01 * ent + 0.5 * v, rel=1e-6)
    assert stats["clipfrac"] == pytest.approx(1.0)  # |1.25-1| and |0.8-1| both exceed 0.1
    assert stats["approx_kl"] == pytest.approx(np.mean((r - 1) - np.log(r)), rel=1e-5)
    # -log(1.25) - log(0.8) = 0 exactly; float32 leaves a few 1e-8
    assert stats["old_approx_kl"] == pytest.approx(np.mean(-np.log(r)), abs=1e-6)


def test_ppo_loss_advantage_normalisation_uses_unbiased_std():
    adv = torch.tensor([1.0, 2.0, 4.0])
    zeros = torch.zeros(3)
    _, stats = ppo_loss(zeros, zeros, zeros.view(-1, 1), zeros, adv, zeros, zeros, 0.1, 0.0, 0.5,
                        norm_adv=True, clip_vloss=False)
    stats = as_floats(stats)
    normed = (adv.numpy() - adv.numpy().mean()) / (adv.numpy().std(ddof=1) + 1e-8)
    assert stats["policy_loss"] == pytest.approx(-normed.mean(), abs=1e-7)


def test_explained_variance():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(y, y) == 1.0
    assert explained_variance(np.zeros(4), y) == pytest.approx(1 - np.var(y) / np.var(y))
    assert np.isnan(explained_variance(y, np.ones(4)))


def test_flat_minibatches_cover_every_sample_once():
    plans = flat_minibatches(1024, 4, np.random.default_rng(1))
    assert [len(p) for p in plans] == [256] * 4
    assert sorted(np.concatenate(plans).tolist()) == list(range(1024))


def test_env_minibatches_are_whole_sequences_time_major():
    T, N = 5, 8
    plans = env_minibatches(N, T, 4, np.random.default_rng(1))
    assert sorted(np.concatenate([e for e, _ in plans]).tolist()) == list(range(N))
    assert sorted(np.concatenate([i for _, i in plans]).tolist()) == list(range(T * N))
    for envs, inds in plans:
        assert len(envs) == 2
        # time-major: row t holds the minibatch envs at step t, in mbenvinds order
        np.testing.assert_array_equal(inds.reshape(T, 2) % N, np.tile(envs, (T, 1)))
        np.testing.assert_array_equal(inds.reshape(T, 2) // N,
                                      np.repeat(np.arange(T), 2).reshape(T, 2))


def test_annealed_lr_schedule():
    assert annealed_lr(2.5e-4, 1, 9765) == 2.5e-4
    assert annealed_lr(2.5e-4, 9765, 9765) == pytest.approx(2.5e-4 / 9765)


def test_defaults_match_cleanrl():
    cfg = TrainConfig()
    p = cfg.ppo
    assert (cfg.env.num_envs, p.num_steps, p.num_minibatches, p.update_epochs) == (8, 128, 4, 4)
    assert (p.learning_rate, p.gamma, p.gae_lambda, p.clip_coef) == (2.5e-4, 0.99, 0.95, 0.1)
    assert (p.ent_coef, p.vf_coef, p.max_grad_norm) == (0.01, 0.5, 0.5)
    assert p.anneal_lr and p.norm_adv and p.clip_vloss and p.target_kl is None
    assert (cfg.batch_size, cfg.minibatch_size, cfg.num_iterations) == (1024, 256, 9765)


def test_nature_cnn_shapes_and_init():
    torch.manual_seed(0)
    agent = Agent((4, 84, 84), 6)
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    action, logprob, entropy, value = agent.get_action_and_value(x)
    assert action.shape == logprob.shape == entropy.shape == (3,) and value.shape == (3, 1)
    assert torch.all(agent.critic.bias == 0)
    # policy head gain 0.01: near-uniform initial policy
    assert entropy.min().item() > np.log(6) - 1e-3


def _lstm_case(seed=0, T=12, N=3):
    torch.manual_seed(seed)
    agent = LSTMAgent((1, 84, 84), 4)
    x = torch.randint(0, 256, (T * N, 1, 84, 84), dtype=torch.uint8)
    done = torch.zeros(T, N)
    if T > 7:
        done[3, 0] = done[3, 2] = done[7, 1] = done[0, 1] = 1.0
    state = (torch.randn(1, N, 128), torch.randn(1, N, 128))
    return agent, x, done.reshape(-1), state


def test_lstm_fast_path_equals_stepwise_outputs_and_gradients():
    agent, x, done, state = _lstm_case()
    out_fast, (h_fast, c_fast) = agent.get_states(x, state, done)
    (out_fast.sum() + h_fast.sum() * 0.3 + c_fast.sum() * 0.7).backward()
    grads_fast = {k: p.grad.clone() for k, p in agent.named_parameters() if p.grad is not None}
    assert any(k.startswith("lstm.") for k in grads_fast)
    assert any(k.startswith("network.") for k in grads_fast)
    agent.zero_grad()
    out_slow, (h_slow, c_slow) = agent.get_states_stepwise(x, state, done)
    (out_slow.sum() + h_slow.sum() * 0.3 + c_slow.sum() * 0.7).backward()
    assert torch.allclose(out_fast, out_slow, atol=1e-5)
    assert torch.allclose(h_fast, h_slow, atol=1e-5) and torch.allclose(c_fast, c_slow, atol=1e-5)
    for k, p in agent.named_parameters():
        if k in grads_fast:
            assert torch.allclose(grads_fast[k], p.grad, atol=1e-5), k


def test_lstm_fast_path_makes_one_call_per_stretch():
    agent, x, done, state = _lstm_case()
    calls = []
    handle = agent.lstm.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    agent.get_states(x, state, done)
    handle.remove()
    # dones at t=3 and t=7 (t=0 needs no cut): stretches [0,3), [3,7), [7,12)
    assert calls == [3, 4, 5]


def test_lstm_state_reset_on_done():
    agent, x, _, state = _lstm_case(T=1, N=2)
    with torch.no_grad():
        out_done, _ = agent.get_states(x, state, torch.tensor([1.0, 1.0]))
        zero = (torch.zeros_like(state[0]), torch.zeros_like(state[1]))
        out_zero, _ = agent.get_states(x, zero, torch.tensor([0.0, 0.0]))
        out_kept, _ = agent.get_states(x, state, torch.tensor([0.0, 0.0]))
    assert torch.equal(out_done, out_zero)
    assert not torch.allclose(out_kept, out_zero)


def test_gumbel_sample_draws_the_categorical_distribution():
    """The graph-safe draw of a GPU runner (argmax of logits + Gumbel noise) has the
    distribution of Categorical(logits).sample(), per row: 200k draws of two rows, every
    action's frequency within 5 standard errors of its softmax probability."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.1, -3.0], [0.0, 0.0, 0.0, 0.0, 4.0]])
    n = 200_000
    draws = gumbel_sample(logits.repeat(n, 1), torch.rand((2 * n, 5), generator=gen))
    for row in range(2):
        freq = torch.bincount(draws[row::2], minlength=5).double() / n
        p = torch.softmax(logits[row].double(), dim=0)
        se = (p * (1 - p) / n).sqrt()
        assert ((freq - p).abs() <= 5 * se).all(), (row, freq, p)
    # the edge of torch.rand's range: u = 0 still leaves every action drawable
    assert gumbel_sample(torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 0.0]])).item() in (0, 1, 2)
