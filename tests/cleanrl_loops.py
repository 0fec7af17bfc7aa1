"""CleanRL's three Atari PPO scripts written out in our words, small enough for the suite:
ppo_atari_envpool.py (EnvPool), ppo_atari.py and ppo_atari_lstm.py (gymnasium 0.29's
SyncVectorEnv: same-step auto-reset). Each draws its random numbers as the script does:
random/np.random/torch seeded once, the envs seeded seed + i, the initial weights, then every
action from torch's global stream and every epoch's minibatches by np.random.shuffle in place
on an array made once per iteration. `run(script, ...)` returns what the script logs per
iteration and the final weights (state_dict keys as CleanRL's Agent, so as distppo's).
"""
import random

import cv2
import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

SQRT2 = np.sqrt(2)


def layer_init(layer, std=SQRT2, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The scripts' Agent: Nature CNN on x / 255.0 (frames channels in), with ppo_atari_lstm's
    LSTM(512 -> 128) when `lstm`, then actor and critic, initialised in that order."""

    def __init__(self, frames, num_actions, lstm=False):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(frames, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU())
        width = 512
        if lstm:
            self.lstm = nn.LSTM(512, 128)
            for name, param in self.lstm.named_parameters():
                if "bias" in name:
                    nn.init.constant_(param, 0)
                elif "weight" in name:
                    nn.init.orthogonal_(param, 1.0)
            width = 128
        self.actor = layer_init(nn.Linear(width, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(width, 1), std=1)

    def hidden(self, x, lstm_state=None, done=None):
        """[T*N, ...] -> [T*N, width]; with an LSTM, one LSTM call per time step, the state
        zeroed where done (the script's get_states)."""
        hidden = self.network(x / 255.0)
        if lstm_state is None:
            return hidden, None
        n = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, n, self.lstm.input_size))  # [T*N, W] -> [T, N, W]
        out = []
        for h, d in zip(hidden, done.reshape((-1, n))):
            keep = (1.0 - d).view(1, -1, 1)
            h, lstm_state = self.lstm(h.unsqueeze(0), (keep * lstm_state[0], keep * lstm_state[1]))
            out.append(h)
        return torch.flatten(torch.cat(out), 0, 1), lstm_state  # [T, N, H] -> [T*N, H]

    def value(self, x, lstm_state=None, done=None):
        """The script's get_value: no action drawn."""
        return self.critic(self.hidden(x, lstm_state, done)[0])

    def act(self, x, lstm_state=None, done=None, action=None):
        hidden, lstm_state = self.hidden(x, lstm_state, done)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()  # torch's global stream
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden), lstm_state


def gym_env(env_id, frames):
    """ppo_atari.py's make_env on gymnasium 0.29 (RecordEpisodeStatistics innermost, SB3's
    Atari wrappers, cv2 resize and grey, frame stack)."""
    import ale_py
    from stable_baselines3.common.atari_wrappers import (
        ClipRewardEnv,
        EpisodicLifeEnv,
        FireResetEnv,
        MaxAndSkipEnv,
        NoopResetEnv,
    )
    gym.register_envs(ale_py)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    env = EpisodicLifeEnv(MaxAndSkipEnv(NoopResetEnv(env, noop_max=30), skip=4))
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    env = gym.wrappers.ResizeObservation(ClipRewardEnv(env), (84, 84))
    env = gym.wrappers.TransformObservation(env, lambda o: cv2.cvtColor(o, cv2.COLOR_RGB2GRAY),
                                            gym.spaces.Box(0, 255, (84, 84), np.uint8))
    return gym.wrappers.FrameStackObservation(env, frames)


class Envs:
    """The script's vector env as (reset() -> obs, step(a) -> obs, reward, done)."""

    def __init__(self, script, num_envs, seed):
        self.envpool = script == "ppo_atari_envpool.py"
        self.frames = 1 if script == "ppo_atari_lstm.py" else 4
        self.seed = seed
        if self.envpool:  # as the shims hand the pool to the script: done = term | trunc
            self.vec = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=num_envs,
                                    episodic_life=True, reward_clip=True, seed=seed)
        else:
            self.vec = gym.vector.SyncVectorEnv(
                [lambda: gym_env("BreakoutNoFrameskip-v4", self.frames)] * num_envs,
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.num_actions = int(self.vec.single_action_space.n if not self.envpool
                               else self.vec.action_space.n)

    def reset(self):
        return self.vec.reset()[0] if self.envpool else self.vec.reset(seed=self.seed)[0]

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.vec.step(action)
        return obs, reward, np.logical_or(terminated, truncated)


def gae(rewards, values, dones, next_value, next_done, gamma=0.99, lam=0.95):
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    return advantages, advantages + values


def run(script, num_envs, num_steps, minibatches, epochs, iterations, seed=1, lr=2.5e-4):
    """The script from its seeding to its last iteration; returns ([per-iteration logs],
    final state_dict)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    envs = Envs(script, num_envs, seed)
    lstm = script == "ppo_atari_lstm.py"
    agent = Agent(envs.frames, envs.num_actions, lstm)
    optimizer = optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    next_obs, next_done = torch.Tensor(envs.reset()), torch.zeros(num_envs)
    state = (torch.zeros(1, num_envs, 128), torch.zeros(1, num_envs, 128)) if lstm else None
    logs = []
    for iteration in range(1, iterations + 1):
        initial = (state[0].clone(), state[1].clone()) if lstm else None
        lrnow = (1.0 - (iteration - 1.0) / iterations) * lr
        optimizer.param_groups[0]["lr"] = lrnow
        obs = torch.zeros((num_steps, num_envs, envs.frames, 84, 84))
        actions, logprobs, rewards, dones, values = (torch.zeros((num_steps, num_envs))
                                                     for _ in range(5))
        for step in range(num_steps):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value, state = agent.act(next_obs, state, next_done)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            o, reward, done = envs.step(action.numpy())
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(o), torch.Tensor(done)
        with torch.no_grad():
            next_value = agent.value(next_obs, state, next_done).reshape(1, -1)
            advantages, returns = gae(rewards, values, dones, next_value, next_done)
        b = dict(obs=obs.reshape((-1, envs.frames, 84, 84)), logprobs=logprobs.reshape(-1),
                 actions=actions.reshape(-1).long(), advantages=advantages.reshape(-1),
                 returns=returns.reshape(-1), values=values.reshape(-1), dones=dones.reshape(-1))
        logs.append(update(agent, optimizer, b, initial, num_envs, num_steps, minibatches,
                           epochs))
        logs[-1]["learning_rate"] = lrnow
    return logs, agent.state_dict()


def update(agent, optimizer, b, initial, num_envs, num_steps, minibatches, epochs):
    """The scripts' epochs: the index array made once, shuffled in place by np.random each
    epoch (ppo_atari_lstm.py: env indices, each minibatch whole env sequences)."""
    batch = num_envs * num_steps
    inds = np.arange(num_envs if initial else batch)
    flatinds = np.arange(batch).reshape(num_steps, num_envs)
    clipfracs = []
    for _ in range(epochs):
        np.random.shuffle(inds)
        size = len(inds) // minibatches
        for start in range(0, len(inds), size):
            mbenv = inds[start:start + size] if initial else None
            mb = flatinds[:, mbenv].ravel() if initial else inds[start:start + size]
            st = (initial[0][:, mbenv], initial[1][:, mbenv]) if initial else None
            _, newlogprob, entropy, newvalue, _ = agent.act(b["obs"][mb], st, b["dones"][mb],
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
    return dict(value_loss=v_loss.item(), policy_loss=pg_loss.item(),
                entropy=entropy_loss.item(), old_approx_kl=old_approx_kl.item(),
                approx_kl=approx_kl.item(), clipfrac=np.mean(clipfracs),
                explained_variance=1 - np.var(y_true - y_pred) / np.var(y_true))
