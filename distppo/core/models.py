"""Agent (Nature CNN or MLP trunk + linear heads) and LSTMAgent, initialised as CleanRL does.

Image observations arrive as uint8 [B, C, 84, 84] and become float on the model's device, once,
inside the forward pass (hyperparameters.md section 3). Vector observations (classic control)
go through a small tanh MLP instead, so the same trainer runs CartPole.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def make_trunk(obs_shape: tuple) -> tuple[nn.Module, int]:
    """Nature CNN for (C, 84, 84) images, a 64-64 tanh MLP for 1-D vectors; returns (net, width)."""
    if len(obs_shape) == 3:
        net = nn.Sequential(
            layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),  # [B, 64, 7, 7] -> [B, 3136]
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        return net, 512
    if len(obs_shape) == 1:
        net = nn.Sequential(
            layer_init(nn.Linear(obs_shape[0], 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
        )
        return net, 64
    raise ValueError(f"unsupported observation shape {obs_shape}")


def preprocess(x: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 pixels -> float in [0, 1]; float vectors pass through unchanged. channels_last:
    images in the memory layout of a channels_last CNN (same values, NHWC strides), which
    oneDNN and cuDNN convolve faster (docs/benchmarks.md)."""
    if channels_last and x.dim() == 4:  # reorder the uint8 pixels (a quarter of the bytes);
        x = x.contiguous(memory_format=torch.channels_last)  # float() and div keep the layout
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)  # in place: one float copy of the batch, not two
    return x.float()


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] along dim 0, in x's memory layout. A channels_last image batch [B, C, H, W]
    stays channels_last: its rows are contiguous NHWC blocks, gathered with one index_select
    (x[index] copies it element by element; index_select on x itself returns the plain
    layout, which the CNN would reorder again)."""
    nhwc = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
    if nhwc and not x.is_contiguous():  # (C == 1 is both layouts: plain indexing is fine)
        return x.permute(0, 2, 3, 1).index_select(0, index).permute(0, 3, 1, 2)
    return x[index]


def use_channels_last(module: nn.Module, obs_shape: tuple, on: bool) -> bool:
    """Put an image trunk's weights in channels_last; False (nothing done) for vectors."""
    if not on or len(obs_shape) != 3:
        return False
    module.network.to(memory_format=torch.channels_last)
    return True


def sample(probs: Categorical, generator: torch.Generator | None, greedy: bool = False
           ) -> torch.Tensor:
    """Categorical.sample() with an explicit generator: each sampler owns its random stream,
    so one process (local mode) and one process per runner (Ray) draw the same actions.
    `greedy`: the most likely action instead (`distppo eval --greedy`)."""
    if greedy:
        return probs.probs.argmax(dim=-1)
    p = probs.probs
    if generator is not None and generator.device != p.device:  # a CPU stream, a GPU policy
        return torch.multinomial(p.cpu(), 1, True, generator=generator).squeeze(-1).to(p.device)
    return torch.multinomial(p, 1, True, generator=generator).squeeze(-1)


def gumbel_sample(logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A draw from Categorical(logits=logits) [N, A] -> [N] as argmax(logits + Gumbel noise),
    the noise made from `uniform` [N, A] in [0, 1). Unlike torch.multinomial it needs no host
    sync and no data-dependent shape, so a CUDA graph can capture it (core/captured.py)."""
    tiny = torch.finfo(uniform.dtype).tiny  # log(0) would make an action impossible to draw
    return torch.argmax(logits - torch.log(-torch.log(uniform.clamp_min(tiny))), dim=-1)


class Agent(nn.Module):
    """Shared Nature-CNN trunk for images (ppo_atari.py); for vectors, separate actor and
    critic MLPs as CleanRL's ppo.py has them (`critic_network` is None for images)."""

    def __init__(self, obs_shape: tuple, num_actions: int, channels_last: bool = False):
        super().__init__()
        self.network, width = make_trunk(obs_shape)
        self.critic_network = make_trunk(obs_shape)[0] if len(obs_shape) == 1 else None
        self.actor = layer_init(nn.Linear(width, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(width, 1), std=1)
        self.channels_last = use_channels_last(self, obs_shape, channels_last)

    def _value(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        if self.critic_network is None:
            return self.critic(hidden)
        return self.critic(self.critic_network(x))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        x = preprocess(x, self.channels_last)
        return self._value(x, self.network(x) if self.critic_network is None else None)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [N, A] and value [N, 1] of preprocessed observations x (`preprocess`)."""
        hidden = self.network(x)
        return self.actor(hidden), self._value(x, hidden)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None,
                             generator: torch.Generator | None = None, greedy: bool = False):
        logits, value = self.heads(preprocess(x, self.channels_last))
        probs = Categorical(logits=logits)
        if action is None:
            action = sample(probs, generator, greedy)
        return action, probs.log_prob(action), probs.entropy(), value


class LSTMAgent(nn.Module):
    """CleanRL's ppo_atari_lstm network: trunk -> LSTM(width -> 128) -> heads."""

    hidden_size = 128

    def __init__(self, obs_shape: tuple, num_actions: int, channels_last: bool = False,
                 fused: bool = True):
        super().__init__()
        self.fused = fused  # False: CleanRL's one LSTM call per time step (get_states_stepwise)
        self.network, width = make_trunk(obs_shape)
        self.lstm = nn.LSTM(width, self.hidden_size)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(self.hidden_size, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(self.hidden_size, 1), std=1)
        self.channels_last = use_channels_last(self, obs_shape, channels_last)

    def initial_state(self, num_envs: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
        zeros = torch.zeros(self.lstm.num_layers, num_envs, self.hidden_size, device=device)
        return zeros, zeros.clone()

    def get_states(self, x, lstm_state, done):
        """Run the LSTM over a time-major sequence, zeroing each env's state where done is set.

        x: [T*N, ...] time-major, done: [T*N] (the flag that arrived with that observation),
        lstm_state: ([1, N, H], [1, N, H]). Returns ([T*N, H], final state).

        Fast path: the sequence is cut only at time steps where some env is done; each stretch
        in between is one nn.LSTM call. Equal (outputs and gradients) to stepping one time step
        at a time, which `get_states_stepwise` keeps as the reference (and runs when `fused` is
        off: --no-fused-lstm).
        """
        if not self.fused:
            return self.get_states_stepwise(x, lstm_state, done)
        hidden = self.network(preprocess(x, self.channels_last))
        n = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, n, self.lstm.input_size))  # [T*N, W] -> [T, N, W]
        done = done.reshape((-1, n))  # [T*N] -> [T, N]
        cut = torch.nonzero(done[1:].any(dim=1)).flatten() + 1
        bounds = [0] + cut.tolist() + [hidden.shape[0]]
        h, c = lstm_state
        outputs = []
        for start, end in zip(bounds[:-1], bounds[1:]):
            keep = (1.0 - done[start].float()).view(1, -1, 1)  # [N] -> [1, N, 1]
            out, (h, c) = self.lstm(hidden[start:end], (keep * h, keep * c))
            outputs.append(out)
        new_hidden = torch.flatten(torch.cat(outputs), 0, 1)  # [T, N, H] -> [T*N, H]
        return new_hidden, (h, c)

    def get_states_stepwise(self, x, lstm_state, done):
        """Reference: CleanRL's one-LSTM-call-per-step loop (slow; used by tests)."""
        hidden = self.network(preprocess(x, self.channels_last))
        n = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, n, self.lstm.input_size))  # [T*N, W] -> [T, N, W]
        done = done.reshape((-1, n))  # [T*N] -> [T, N]
        outputs = []
        for h_t, d in zip(hidden, done):
            keep = (1.0 - d.float()).view(1, -1, 1)
            h_t, lstm_state = self.lstm(h_t.unsqueeze(0),
                                        (keep * lstm_state[0], keep * lstm_state[1]))
            outputs += [h_t]
        return torch.flatten(torch.cat(outputs), 0, 1), lstm_state

    def get_value(self, x, lstm_state, done):
        hidden, _ = self.get_states(x, lstm_state, done)
        return self.critic(hidden)

    def get_action_and_value(self, x, lstm_state, done, action=None, generator=None,
                             greedy=False):
        hidden, lstm_state = self.get_states(x, lstm_state, done)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = sample(probs, generator, greedy)
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden), lstm_state


def make_agent(algo: str, obs_shape: tuple, num_actions: int,
               channels_last: bool = False, fused_lstm: bool = True) -> nn.Module:
    if algo == "ppo_lstm":
        return LSTMAgent(obs_shape, num_actions, channels_last, fused_lstm)
    return Agent(obs_shape, num_actions, channels_last)
