"""Our training math against CleanRL's, step by step, on fixed data (no emulator, no Ray).

1. `update()` against CleanRL's update loop written out here from ppo_atari.py /
   ppo_atari_lstm.py (GAE, epochs, shuffled minibatches, normalised advantages, clipped value
   loss, gradient clipping): equal weights after one update.
2. PPO-LSTM on EnvPool's next-step auto-reset ordering, with exact resets: on a scripted
   sequence of lives, the LSTM states, values and GAE targets of every real step equal those
   of gym's same-step ordering, and so do the weights after an update.
"""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

from distppo.config import EnvConfig, PPOConfig, TrainConfig
from distppo.core.models import Agent, LSTMAgent
from distppo.core.ppo import compute_gae
from distppo.core.rollout import RolloutBatch
from distppo.core.sampler import Sampler
from distppo.core.update import update
from distppo.envs.types import StepResult

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(algo, num_envs, num_steps, num_minibatches=2, update_epochs=3, iterations=4):
    return TrainConfig(
        env=EnvConfig(env_id="CartPole-v1", backend="gym", num_envs=num_envs),
        ppo=PPOConfig(algo=algo, num_steps=num_steps, num_minibatches=num_minibatches,
                      update_epochs=update_epochs,
                      total_timesteps=num_envs * num_steps * iterations))


# --- 1. update() against CleanRL's loop ------------------------------------------------------

def cleanrl_forward(agent, x, lstm_state=None, done=None, action=None):
    """CleanRL's get_action_and_value; for the LSTM its get_states loop, one step at a time."""
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    hidden = agent.network(x)
    if lstm_state is not None:
        n = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, n, agent.lstm.input_size))
        done = done.reshape((-1, n))
        new_hidden = []
        for h, d in zip(hidden, done):
            h, lstm_state = agent.lstm(h.unsqueeze(0), ((1.0 - d).view(1, -1, 1) * lstm_state[0],
                                                        (1.0 - d).view(1, -1, 1) * lstm_state[1]))
            new_hidden += [h]
        hidden = torch.flatten(torch.cat(new_hidden), 0, 1)
    probs = Categorical(logits=agent.actor(hidden))
    return probs.log_prob(action), probs.entropy(), agent.critic(hidden)


def cleanrl_update(agent, optimizer, batch, args, iteration, num_iterations, rng):
    """ppo_atari.py (ppo_atari_lstm.py with an LSTM) from the learning-rate line to the end of
    the epochs, on one rollout; `rng.shuffle` stands in for np.random.shuffle."""
    envinds = b_inds = envsperbatch = None
    obs, actions, logprobs = (torch.as_tensor(a) for a in (batch.obs, batch.actions,
                                                           batch.logprobs))
    rewards, values = torch.as_tensor(batch.rewards), torch.as_tensor(batch.values)
    dones = torch.as_tensor(batch.dones).float()
    next_value = torch.as_tensor(batch.next_value).reshape(1, -1)
    next_done = torch.as_tensor(batch.next_done).float()
    num_steps, num_envs = rewards.shape
    frac = 1.0 - (iteration - 1.0) / num_iterations
    optimizer.param_groups[0]["lr"] = frac * args.learning_rate

    with torch.no_grad():
        advantages = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                nextnonterminal = 1.0 - next_done
                nextvalues = next_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]
                nextvalues = values[t + 1]
            delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = (delta + args.gamma * args.gae_lambda
                                          * nextnonterminal * lastgaelam)
        returns = advantages + values

    b_obs = obs.reshape((-1,) + obs.shape[2:])
    b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
    b_dones, b_advantages = dones.reshape(-1), advantages.reshape(-1)
    b_returns, b_values = returns.reshape(-1), values.reshape(-1)
    batch_size = num_steps * num_envs
    lstm = batch.lstm_state is not None
    if lstm:
        initial_lstm_state = tuple(torch.as_tensor(s) for s in batch.lstm_state)
        envsperbatch = num_envs // args.num_minibatches
        flatinds = np.arange(batch_size).reshape(num_steps, num_envs)
        minibatch_size = envsperbatch * num_steps
    else:
        minibatch_size = batch_size // args.num_minibatches

    for _epoch in range(args.update_epochs):
        # CleanRL shuffles its previous permutation in place with the global np.random; each
        # epoch's order is a uniform permutation either way. Ours draws each from a fresh
        # arange with the learner's own generator (docs/semantics.md), and so does this loop.
        if lstm:
            envinds = np.arange(num_envs)
        else:
            b_inds = np.arange(batch_size)
        rng.shuffle(envinds if lstm else b_inds)
        for start in range(0, num_envs if lstm else batch_size,
                           envsperbatch if lstm else minibatch_size):
            if lstm:
                mbenvinds = envinds[start:start + envsperbatch]
                mb_inds = flatinds[:, mbenvinds].ravel()
                newlogprob, entropy, newvalue = cleanrl_forward(
                    agent, b_obs[mb_inds], (initial_lstm_state[0][:, mbenvinds],
                                            initial_lstm_state[1][:, mbenvinds]),
                    b_dones[mb_inds], b_actions[mb_inds])
            else:
                mb_inds = b_inds[start:start + minibatch_size]
                newlogprob, entropy, newvalue = cleanrl_forward(
                    agent, b_obs[mb_inds], action=b_actions[mb_inds])
            logratio = newlogprob - b_logprobs[mb_inds]
            ratio = logratio.exp()
            mb_advantages = b_advantages[mb_inds]
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            newvalue = newvalue.view(-1)
            v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
            v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds],
                                                        -args.clip_coef, args.clip_coef)
            v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()


def _fixed_batch(agent, obs_shape, num_steps, num_envs, seed):
    """A rollout-shaped batch: random frames and dones, the agent's own actions and values."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (num_steps, num_envs, *obs_shape), dtype=torch.uint8,
                        generator=g)
    dones = torch.rand(num_steps, num_envs, generator=g) < 0.1
    lstm_state = None
    with torch.no_grad():
        flat = obs.reshape(-1, *obs_shape)   # [T, N, ...] -> [T*N, ...]
        if isinstance(agent, LSTMAgent):
            lstm_state = tuple(torch.randn(1, num_envs, agent.hidden_size, generator=g)
                               for _ in range(2))
            actions, logprobs, _, values, _ = agent.get_action_and_value(
                flat, lstm_state, dones.reshape(-1).float(), generator=g)
        else:
            actions, logprobs, _, values = agent.get_action_and_value(flat, generator=g)
    rewards = torch.randint(-1, 2, (num_steps, num_envs), generator=g).float()
    return RolloutBatch(
        obs=obs.numpy(), actions=actions.reshape(num_steps, num_envs).numpy(),
        logprobs=logprobs.reshape(num_steps, num_envs).numpy(),
        values=values.reshape(num_steps, num_envs).numpy(), rewards=rewards.numpy(),
        dones=dones.numpy(), next_value=torch.randn(num_envs, generator=g).numpy(),
        next_done=np.array([True] + [False] * (num_envs - 1)),
        lstm_state=None if lstm_state is None else tuple(s.numpy() for s in lstm_state))


@pytest.mark.parametrize("algo,fused", [("ppo", True), ("ppo_lstm", True), ("ppo_lstm", False)])
def test_update_equals_cleanrl_loop(algo, fused):
    """One update() on a fixed Atari-shaped batch (iteration 2: the annealed rate) against
    CleanRL's loop written out above, from the same weights, optimizer and shuffles.
    `fused` False is --no-fused-lstm (the bench's CleanRL mode): CleanRL's step loop, bit
    for bit."""
    num_steps, num_envs = 16, 4
    obs_shape = (1 if algo == "ppo_lstm" else 4, 84, 84)
    cfg = _cfg(algo, num_envs, num_steps)
    torch.manual_seed(3)
    agent = LSTMAgent(obs_shape, 4, fused=fused) if algo == "ppo_lstm" else Agent(obs_shape, 4)
    batch = _fixed_batch(agent, obs_shape, num_steps, num_envs, seed=5)
    initial, ref, ours = copy.deepcopy(agent), copy.deepcopy(agent), agent
    opt_ours = torch.optim.Adam(ours.parameters(), lr=cfg.ppo.learning_rate, eps=1e-5)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=cfg.ppo.learning_rate, eps=1e-5)
    stats = update(ours, opt_ours, batch, cfg, 2, np.random.default_rng(7), torch.device("cpu"))
    cleanrl_update(ref, opt_ref, batch, cfg.ppo, 2, cfg.num_iterations, np.random.default_rng(7))
    assert stats["learning_rate"] == opt_ref.param_groups[0]["lr"] == 0.75 * 2.5e-4
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        if algo == "ppo" or not fused:   # the same operations in the same order: the same bits
            assert torch.equal(p, q), name
        else:   # our LSTM runs whole stretches between dones, CleanRL one step at a time
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert all(not torch.equal(p, p0) for p, p0 in zip(ours.parameters(), initial.parameters()))


# --- 2. PPO-LSTM on EnvPool's ordering equals gym's -------------------------------------------

class ScriptedLives:
    """Vector-observation envs replaying scripted lives, in one of two auto-reset orderings.

    Env i lives lives[i] = [L0, L1, ...]: life k has L observations O(i, k, j), and its L-th
    transition ends it. "same_step" (gym): the done arrives with O(i, k+1, 0). "next_step"
    (EnvPool): the done arrives with a terminal frame; the next call ignores the action,
    returns O(i, k+1, 0), reward 0, done False, and says so in `autoreset`.
    """

    num_actions, obs_shape, obs_dtype = 3, (4,), np.dtype(np.float32)

    def __init__(self, lives, ordering):
        self.lives, self.ordering, self.num_envs = lives, ordering, len(lives)

    @staticmethod
    def frame(i, k, j):   # j = -1: the terminal frame of life k
        return np.random.default_rng([i, k, j + 1]).standard_normal(4).astype(np.float32)

    def reset(self):
        self.pos = [[0, 0] for _ in self.lives]
        self.pending = [False] * self.num_envs
        return np.stack([self.frame(i, 0, 0) for i in range(self.num_envs)])

    def step(self, actions):
        out = [self._step(i) for i in range(self.num_envs)]
        obs, reward, done, autoreset = (np.array(x) for x in zip(*out))
        return StepResult(obs.astype(np.float32), reward.astype(np.float32), done, [],
                          autoreset if self.ordering == "next_step" else None)

    def _step(self, i):
        k, j = self.pos[i]
        if self.pending[i]:   # EnvPool's reset step
            self.pending[i] = False
            return self.frame(i, k, 0), 0.0, False, True
        reward = float((i + k + j) % 3 - 1)
        j += 1
        if j < self.lives[i][k]:
            self.pos[i] = [k, j]
            return self.frame(i, k, j), reward, False, False
        self.pos[i] = [k + 1, 0]
        if self.ordering == "same_step":
            return self.frame(i, k + 1, 0), reward, True, False
        self.pending[i] = True
        return self.frame(i, k, -1), reward, True, False

    def close(self):
        pass


# Env 0's second life ends on the last step of the first EnvPool rollout (its terminal frame is
# obs[15]); env 1's lives end mid-rollout. Each has 2 reset steps in the first 16 EnvPool
# steps, so 14 gym steps cover the same real transitions; the second rollouts have no reset.
LIVES = [[5, 9, 40], [9, 4, 40]]
ROLLOUTS = {"next_step": (16, 16), "same_step": (14, 16)}


def _rollouts(agent, ordering, exact=True):
    sampler = Sampler([ScriptedLives(LIVES, ordering)], copy.deepcopy(agent), 1, seed=0,
                      exact_resets=exact)
    batches = []
    for num_steps in ROLLOUTS[ordering]:
        sampler.num_steps = num_steps
        batches.append(sampler.collect())
    return batches


def _real_steps(batch, i):
    """Env i's time indices that are steps of the game (all of them for gym's ordering)."""
    return np.flatnonzero(batch.valid[:, i]) if batch.valid is not None else np.arange(
        batch.num_steps)


def _gae(batch):
    return compute_gae(*(torch.as_tensor(a) for a in (batch.rewards, batch.values, batch.dones,
                                                       batch.next_value, batch.next_done)),
                       gamma=0.99, gae_lambda=0.95)


def _replayed_hidden(agent, batch):
    """The learner's view: the LSTM over the rollout from its start state, [T, N, H]."""
    with torch.no_grad():
        hidden, _ = agent.get_states(torch.as_tensor(batch.obs).reshape(-1, 4),
                                     tuple(torch.as_tensor(s) for s in batch.lstm_state),
                                     torch.as_tensor(batch.dones).reshape(-1).float())
    return hidden.reshape(batch.num_steps, batch.num_envs, -1)   # [T*N, H] -> [T, N, H]


def test_envpool_lstm_states_and_gae_targets_equal_gym_ordering():
    torch.manual_seed(0)
    agent = LSTMAgent((4,), 3)
    envpool, gym = _rollouts(agent, "next_step"), _rollouts(agent, "same_step")
    for ep, g in zip(envpool, gym):
        ep_adv, ep_ret = _gae(ep)
        g_adv, g_ret = _gae(g)
        ep_hidden, g_hidden = _replayed_hidden(agent, ep), _replayed_hidden(agent, g)
        for i in range(len(LIVES)):
            real = _real_steps(ep, i)
            assert len(real) == g.num_steps
            np.testing.assert_array_equal(ep.obs[real, i], g.obs[:, i])
            np.testing.assert_array_equal(ep.rewards[real, i], g.rewards[:, i])
            np.testing.assert_array_equal(ep.dones[real, i], g.dones[:, i])
            torch.testing.assert_close(ep_hidden[real, i], g_hidden[:, i])
            np.testing.assert_allclose(ep.values[real, i], g.values[:, i], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(ep_adv[real, i], g_adv[:, i])
            torch.testing.assert_close(ep_ret[real, i], g_ret[:, i])
        assert ep.next_done.tolist() == g.next_done.tolist()
        np.testing.assert_allclose(ep.next_value, g.next_value, rtol=1e-6, atol=1e-6)
    assert envpool[0].valid is not None and (~envpool[0].valid).sum() == 4
    assert envpool[1].valid is None   # no reset step in the second rollout

    # CleanRL's loop on EnvPool's ordering: a new life starts from the terminal frame's state,
    # so the values of the second lives differ from gym's.
    plain = _rollouts(agent, "next_step", exact=False)[0]
    assert plain.valid is None
    second_life = [6, 10]   # EnvPool steps of O(i, 1, 0) for envs 0 and 1
    for i, t in enumerate(second_life):
        assert np.array_equal(plain.obs[t, i], ScriptedLives.frame(i, 1, 0))
        g_t = list(_real_steps(envpool[0], i)).index(t)
        assert abs(plain.values[t, i] - gym[0].values[g_t, i]) > 1e-4


def test_envpool_lstm_update_equals_gym_ordering_update():
    """The same real transitions in both orderings (EnvPool's with its reset steps in
    between): one update() from the same weights and shuffles gives the same weights."""
    torch.manual_seed(0)
    agent = LSTMAgent((4,), 3)
    envpool, gym = _rollouts(agent, "next_step")[0], _rollouts(agent, "same_step")[0]
    for i in range(len(LIVES)):   # the same old actions, logprobs and values on real steps
        real = _real_steps(envpool, i)
        for name in ("actions", "logprobs", "values"):
            getattr(envpool, name)[real, i] = getattr(gym, name)[:, i]
    cfg = _cfg("ppo_lstm", num_envs=2, num_steps=16, num_minibatches=2, update_epochs=3)
    weights = []
    for batch in (envpool, gym):
        learner = copy.deepcopy(agent)
        opt = torch.optim.Adam(learner.parameters(), lr=cfg.ppo.learning_rate, eps=1e-5)
        stats = update(learner, opt, batch, cfg, 1, np.random.default_rng(3),
                       torch.device("cpu"))
        weights.append((learner.state_dict(), stats))
    (w_ep, s_ep), (w_g, s_g) = weights
    for name in w_g:
        torch.testing.assert_close(w_ep[name], w_g[name], rtol=1e-5, atol=1e-6, msg=name)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "explained_variance"):
        assert s_ep[key] == pytest.approx(s_g[key], rel=1e-4, abs=1e-6), key
