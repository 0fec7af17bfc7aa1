"""--exact-replay against CleanRL's scripts: a few iterations of `distppo train --local
--exact-replay` equal, scalar for scalar and weight for weight, CleanRL's loop written out
here (its seeding, env seeds, global-stream action draws and np.random.shuffle in place).

With DISTPPO_CLEANRL_DIR naming a CleanRL checkout (and gym and tyro installed), the real
script runs too, through launch/parity_study.py --exact-replay; skipped otherwise.
"""
import importlib.util
import os
import random
import sys

import envpool
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

from distppo.config import TrainConfig
from distppo.core.backend import LocalBackend
from distppo.core.loop import train
from distppo.distributed.factory import make_backend
from distppo.errors import ConfigError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "launch"))
import exact_replay  # noqa: E402

SEED, NUM_ENVS, NUM_STEPS, ITERATIONS = 1, 4, 32, 3
MINIBATCHES, EPOCHS = 2, 2
SCALARS = ("learning_rate", "value_loss", "policy_loss", "entropy", "old_approx_kl",
           "approx_kl", "clipfrac", "explained_variance")


SQRT2 = np.sqrt(2)


def layer_init(layer, std=SQRT2, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class CleanRLAgent(nn.Module):
    """ppo_atari_envpool.py's Agent: Nature CNN on x / 255.0, then the two heads."""

    def __init__(self, num_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU())
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()  # torch's global stream
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def ppo_update(agent, optimizer, b, batch_size, stats):
    """CleanRL's epochs: b_inds made once, shuffled in place by np.random each epoch."""
    b_inds = np.arange(batch_size)
    minibatch_size = batch_size // MINIBATCHES
    clipfracs = []
    for _ in range(EPOCHS):
        np.random.shuffle(b_inds)
        for start in range(0, batch_size, minibatch_size):
            mb = b_inds[start:start + minibatch_size]
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b["obs"][mb],
                                                                          b["actions"][mb])
            logratio = newlogprob - b["logprobs"][mb]
            ratio = logratio.exp()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > 0.1).float().mean().item())
            adv = b["advantages"][mb]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.9, 1.1)).mean()
            newvalue = newvalue.view(-1)
            v_clipped = b["values"][mb] + torch.clamp(newvalue - b["values"][mb], -0.1, 0.1)
            v_loss = 0.5 * torch.max((newvalue - b["returns"][mb]) ** 2,
                                     (v_clipped - b["returns"][mb]) ** 2).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - 0.01 * entropy_loss + v_loss * 0.5
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()
    y_pred, y_true = b["values"].numpy(), b["returns"].numpy()
    stats.append(dict(value_loss=v_loss.item(), policy_loss=pg_loss.item(),
                      entropy=entropy_loss.item(), old_approx_kl=old_approx_kl.item(),
                      approx_kl=approx_kl.item(), clipfrac=np.mean(clipfracs),
                      explained_variance=1 - np.var(y_true - y_pred) / np.var(y_true)))


def gae(rewards, values, dones, next_value, next_done):
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(NUM_STEPS)):
        if t == NUM_STEPS - 1:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + 0.99 * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + 0.99 * 0.95 * nextnonterminal * lastgaelam
    return advantages, advantages + values


def cleanrl_envpool_run():
    """ppo_atari_envpool.py from its seeding to the last iteration's log line (the pool as
    the shims hand it to the script: done = terminated or truncated)."""
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    envs = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=NUM_ENVS,
                        episodic_life=True, reward_clip=True, seed=SEED)
    agent = CleanRLAgent(int(envs.action_space.n))
    optimizer = optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    next_obs = torch.Tensor(envs.reset()[0])
    next_done = torch.zeros(NUM_ENVS)
    stats = []
    for iteration in range(1, ITERATIONS + 1):
        lrnow = (1.0 - (iteration - 1.0) / ITERATIONS) * 2.5e-4
        optimizer.param_groups[0]["lr"] = lrnow
        obs = torch.zeros((NUM_STEPS, NUM_ENVS, 4, 84, 84))
        actions, logprobs, rewards, dones, values = (torch.zeros((NUM_STEPS, NUM_ENVS))
                                                     for _ in range(5))
        for step in range(NUM_STEPS):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs = torch.Tensor(next_obs)
            next_done = torch.Tensor(np.logical_or(terminated, truncated))
        with torch.no_grad():
            next_value = agent.critic(agent.network(next_obs / 255.0)).reshape(1, -1)
            advantages, returns = gae(rewards, values, dones, next_value, next_done)
        b = dict(obs=obs.reshape((-1, 4, 84, 84)), logprobs=logprobs.reshape(-1),
                 actions=actions.reshape(-1).long(), advantages=advantages.reshape(-1),
                 returns=returns.reshape(-1), values=values.reshape(-1))
        ppo_update(agent, optimizer, b, NUM_ENVS * NUM_STEPS, stats)
        stats[-1]["learning_rate"] = lrnow
    envs.close()
    return stats, agent.state_dict()


def exact_cfg(tmp_path, **kw):
    flat = dict(env_id="Breakout-v5", backend="envpool", algo="ppo", num_envs=NUM_ENVS,
                num_steps=NUM_STEPS, num_minibatches=MINIBATCHES, update_epochs=EPOCHS,
                total_timesteps=NUM_ENVS * NUM_STEPS * ITERATIONS, seed=SEED, num_threads=1,
                local=True, exact_replay=True, cuda=False, save_model=True,
                output_dir=str(tmp_path), run_name="replay")
    flat.update(kw)
    return TrainConfig().replace(**flat)


@pytest.mark.usefixtures("one_torch_thread")
def test_envpool_exact_replay_equals_cleanrl_loop(tmp_path):
    paths = train(exact_cfg(tmp_path), LocalBackend, progress=False)
    ours = pd.read_parquet(paths.parquet)
    theirs, weights = cleanrl_envpool_run()
    assert list(ours["iteration"]) == list(range(1, ITERATIONS + 1))
    for it, row in enumerate(theirs):
        for name in SCALARS:  # the float each side logs, exactly
            assert ours[name].iloc[it] == float(row[name]), (it + 1, name)
    model = torch.load(os.path.join(paths.run_dir, "distppo.cleanrl_model"))
    for key, value in weights.items():
        torch.testing.assert_close(model[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("flags, refusal", [
    (dict(num_env_runners=2), "--num-env-runners 2"),
    (dict(env_groups=2), "--env-groups 2"),
    (dict(overlap=True), "--overlap"),
    (dict(backend="ale"), "is none of them"),
    (dict(algo="ppo_lstm"), "is none of them"),
])
def test_exact_replay_refuses_what_it_cannot_honour(tmp_path, flags, refusal):
    with pytest.raises(ConfigError, match=refusal):
        exact_cfg(tmp_path, **flags)


def test_exact_replay_refuses_the_ray_runtime(tmp_path):
    with pytest.raises(ConfigError, match="add --local"):
        make_backend(exact_cfg(tmp_path, local=False))


CLEANRL_DIR = os.environ.get("DISTPPO_CLEANRL_DIR", "")
NO_CLEANRL = (
    "DISTPPO_CLEANRL_DIR is not set to a CleanRL checkout" if not os.path.isdir(
        os.path.join(CLEANRL_DIR, "cleanrl")) else
    "CleanRL's script needs gym and tyro (pip install gym==0.26.2 tyro)" if any(
        importlib.util.find_spec(m) is None for m in ("gym", "tyro")) else None)


@pytest.mark.skipif(NO_CLEANRL is not None, reason=str(NO_CLEANRL))
@pytest.mark.parametrize("script", ["ppo_atari_envpool.py"])
def test_real_script_equals_exact_replay(tmp_path, script):
    exact_replay.main(["--cleanrl-dir", CLEANRL_DIR, "--script", script, "--iterations", "2",
                       "--out", str(tmp_path), "--timeout-s", "900"])
    table = pd.read_parquet(tmp_path / "comparison.parquet")
    assert set(exact_replay.PER_ITERATION) <= set(table["tag"])
    assert table["first_diff_iteration"].isna().all(), table.to_string()
    assert (table["equal_points"] == table["cleanrl_points"]).all()
