"""The acting step, shared by the Sampler (training rollouts) and `distppo eval`."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from distppo.core.captured import CapturedPolicyStep
from distppo.core.models import LSTMAgent


class PolicyState:
    """What acting carries from one step to the next: the LSTM state (None for the CNN/MLP),
    and with cuda_graphs (--cuda-graphs, a feedforward agent on a GPU) the captured step,
    made at the first step from its observations."""

    def __init__(self, agent: torch.nn.Module, num_envs: int, cuda_graphs: bool = False):
        self.is_lstm = isinstance(agent, LSTMAgent)
        self.device = next(agent.parameters()).device
        self.lstm = agent.initial_state(num_envs, self.device) if self.is_lstm else None
        self.graphs = cuda_graphs and not self.is_lstm and self.device.type == "cuda"
        self.captured: Optional[CapturedPolicyStep] = None


@torch.no_grad()
def policy_step(agent: torch.nn.Module, obs: np.ndarray, done: np.ndarray, state: PolicyState,
                generator: Optional[torch.Generator], greedy: bool = False):
    """Actions for one vector-env step; advances `state`.

    obs [N, *obs_shape] (the env's dtype), done [N] bool (arrived with obs). Returns tensors
    action [N], logprob [N], value [N, 1], on the CPU (the policy may act on a GPU).
    """
    if state.graphs and not greedy:
        if state.captured is None:  # draws from the device's stream (the sampler seeded it)
            state.captured = CapturedPolicyStep(agent, obs)
        return state.captured.step(obs)
    x = torch.from_numpy(obs).to(state.device)
    if state.is_lstm:
        done_t = torch.from_numpy(done).float().to(state.device)
        action, logprob, _, value, state.lstm = agent.get_action_and_value(
            x, state.lstm, done_t, generator=generator, greedy=greedy)
    else:
        action, logprob, _, value = agent.get_action_and_value(x, generator=generator,
                                                               greedy=greedy)
    return action.cpu(), logprob.cpu(), value.cpu()


@torch.no_grad()
def policy_value(agent: torch.nn.Module, obs: np.ndarray, done: np.ndarray,
                 state: PolicyState) -> torch.Tensor:
    """The value of obs [N, ...] without advancing `state` (the rollout's bootstrap value)."""
    x = torch.from_numpy(obs).to(state.device)
    if state.is_lstm:
        done_t = torch.from_numpy(done).float().to(state.device)
        return agent.get_value(x, state.lstm, done_t).cpu()
    return agent.get_value(x).cpu()
